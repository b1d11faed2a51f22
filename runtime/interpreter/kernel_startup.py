"""Runs inside every python kernel at start (``--IPKernelApp.exec_files``), never in the server.

Adds the display formats the Code Interpreter clients read besides Jupyter's own:

- ``e2b/chart``: a matplotlib ``Figure`` → the chart dict of ``e2b_charts.chart_figure_to_dict``
  (only when the ``e2b_charts`` package is installed; a figure it cannot read gets no chart);
- ``e2b/data``: a pandas ``DataFrame`` → ``{column: [values…]}`` with timestamps as ISO text;
- ``application/json``: a dict or list whose JSON round trip works is shown as JSON too
  (upstream's template does the same, so ``{"a": 1}`` as the last line fills ``result.json``).

The formatters recognise those types by name, so neither matplotlib nor pandas is imported
when the kernel starts. A formatter that fails gives no value instead of breaking the whole
display. The file runs in the user's namespace, so everything happens inside one function
that is deleted at the end (and there is no module-level import, not even ``__future__``,
whose name would stay behind).
"""

# ruff: noqa: PLC0415 - imports live inside the function so that no name stays in the user namespace


def _e2b_install_formatters() -> None:
    import importlib.util
    import json
    import math
    from typing import Any

    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from IPython.core.getipython import get_ipython
    from traitlets import ObjectName, Unicode

    shell = get_ipython()
    if shell is None or shell.display_formatter is None:  # not in a kernel
        return
    display = shell.display_formatter

    def plain(value: Any) -> Any:
        # JSON-ready values: timestamps and dates as ISO text, numpy scalars and arrays as
        # Python numbers and lists, NaN and infinities as null (as upstream's orjson does).
        if hasattr(value, "isoformat"):
            return value.isoformat()
        if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    def frame_data(frame: Any) -> dict[str, Any] | None:
        try:
            columns = frame.to_dict(orient="list")
            return {str(name): plain(values) for name, values in columns.items()}
        except Exception:  # noqa: BLE001 - html and text of the frame still go
            return None

    def figure_chart(figure: Any) -> dict[str, Any] | None:
        from e2b_charts import chart_figure_to_dict

        try:
            chart: dict[str, Any] = chart_figure_to_dict(figure)
        except Exception:  # noqa: BLE001 - a figure the extractor does not understand: png and text still go
            return None
        return chart

    def named(obj: Any, modules: tuple[str, ...], name: str) -> bool:
        # By type name, so that the check imports nothing (pandas 2 names DataFrame's
        # module "pandas.core.frame", pandas 3 "pandas").
        return any(cls.__module__ in modules and cls.__name__ == name for cls in type(obj).__mro__)

    charts = importlib.util.find_spec("e2b_charts") is not None

    # Both formatters decide when called rather than through IPython's type registry:
    # matplotlib_inline removes every formatter's Figure entry when the inline backend
    # starts (on the first pyplot import), which would silently drop a registered one.
    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj: Any) -> Any:
            if self.enabled and named(obj, ("pandas", "pandas.core.frame"), "DataFrame"):
                return frame_data(obj)
            return super().__call__(obj)

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj: Any) -> Any:
            if self.enabled and charts and named(obj, ("matplotlib.figure",), "Figure"):
                return figure_chart(obj)
            return super().__call__(obj)

    class RoundTripJSONFormatter(JSONFormatter):
        def __call__(self, obj: Any) -> Any:
            if self.enabled and isinstance(obj, dict | list):
                try:
                    return json.loads(json.dumps(plain(obj), default=plain, allow_nan=False))
                except (TypeError, ValueError, RecursionError):
                    pass  # not JSON after all: the usual _repr_json_ lookup
            return super().__call__(obj)

    display.formatters["e2b/data"] = DataFormatter(parent=display)
    display.formatters["e2b/chart"] = ChartFormatter(parent=display)
    display.formatters["application/json"] = RoundTripJSONFormatter(parent=display)


_e2b_install_formatters()
del _e2b_install_formatters
