"""How each method is drawn in figures: a colour and a marker per method key.

The built-in methods keep one look in every figure (FedPALS and its combinations reds and
oranges, FedAvg blue, the Oracle black); a user's method registers its own with
`register_method_style` (else the figures give it a spare style chosen from its label, stable
across figures).
"""

from __future__ import annotations

# Method -> (colour, marker), shared by every figure. FedPALS and its combinations are reds and
# oranges, FedAvg blue, the Oracle black; unknown methods get the remaining colours in turn.
_BUILT_IN = {
    "fedavg": ("#1f77b4", "o"),
    "fedpals": ("#d62728", "s"),
    "fedprox": ("#2ca02c", "^"),
    "scaffold": ("#9467bd", "v"),
    "afl": ("#8c564b", "D"),
    "fedrs": ("#e377c2", "P"),
    "fedshift": ("#7f7f7f", "X"),
    "oracle": ("#000000", "*"),
    "feddisco": ("#17becf", "h"),
    "fedlc": ("#bcbd22", "p"),
    "fedprox_fedpals": ("#ff7f0e", "^"),
    "fedrs_fedpals": ("#ff9896", "P"),
    "fedshift_fedpals": ("#c49c94", "X"),
    "fedlc_fedpals": ("#dbdb8d", "p"),
    "iwerm": ("#5254a3", "H"),
    "iwerm_fedpals": ("#fd8d3c", "H"),
    "fedvls": ("#8ca252", "d"),
    "fedvls_fedpals": ("#e7969c", "d"),
    "fedpals_adaptive": ("#a50f15", "d"),
    "fedpals_unknown_t_bbse": ("#fb6a4a", "<"),
    "fedpals_unknown_t_bbse_soft": ("#fc9272", ">"),
    "fedpals_unknown_t_em": ("#67000d", "8"),
}
_STYLES: dict[str, tuple[str, str]] = dict(_BUILT_IN)
# Matplotlib's filled and unfilled markers that a line plot and a scatter both draw.
_MARKERS = frozenset("o s ^ v < > D d p P h H X * 8 . x +".split())


def register_method_style(key: str, color: str, marker: str, *, replace: bool = False) -> None:
    """Draws the method `key` (a registered method, variant or combination key, e.g.
    "mymethod" or "mymethod_fedpals") in `color` (any Matplotlib colour) with `marker` (one
    of o s ^ v < > D d p P h H X * 8 . x +) in every figure."""
    import matplotlib.colors  # only here: importing fedjax_pals does not load Matplotlib

    if not isinstance(key, str) or not key:
        raise ValueError(f"a method style's key must be a method key, got {key!r}.")
    if not matplotlib.colors.is_color_like(color):
        raise ValueError(f"method style {key!r}: {color!r} is not a Matplotlib colour.")
    if marker not in _MARKERS:
        raise ValueError(
            f"method style {key!r}: marker {marker!r} is not one of {sorted(_MARKERS)}.")
    if key in _STYLES and not replace and _STYLES[key] != (color, marker):
        raise ValueError(f"method {key!r} has a style already; pass replace=True to change it.")
    _STYLES[key] = (color, marker)


def method_styles() -> dict[str, tuple[str, str]]:
    """{method key: (colour, marker)} of the built-in methods and those registered."""
    return dict(_STYLES)
