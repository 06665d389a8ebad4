"""The MindSpore frontend: the only package of ms_dynvm that imports MindSpore."""
