"""Observability: ms_dynvm's event timeline (`events`), merged into MindSpore Profiler's
trace_view.json (`profiler`); time series and the compile log (`series`); `ms_dynvm.report(path)`
(`report`); the fallback alarm (`alarm`); logging (`log`). Core layer: imports without MindSpore
(`profiler` imports it inside its functions)."""
