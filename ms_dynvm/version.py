"""ms_dynvm's version: part of every kernel cache key (`codegen.kernel.kernel_key`), so a new version
never loads an old version's kernels. A module of its own so that the core layers read it without
importing the package face (`ms_dynvm/__init__.py`)."""

__version__ = "0.1.0"
