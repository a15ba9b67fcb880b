"""How a figure (a measured or predicted number) is written as text: the same in a rank's plain
summary (plscale.rank.metrics, under a plain launcher) and in the host's report tables
(plscale.run.report)."""


def fmt(value) -> str:
    """4 significant digits; 10,000 and above whole, with thousands separators; None as nothing."""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return "" if value is None else str(value)
