"""The constants live once per language; this keeps core.h and conventions.py in step."""

import math
import re
from pathlib import Path

from splat import conventions as cv

CORE = Path(__file__).resolve().parents[1] / "splat" / "kernels" / "core.h"


def _header_constants():
    text = CORE.read_text()
    found = {}
    for name, expr in re.findall(r"constexpr (?:double|int) (k\w+) = ([^;,]+);", text):
        found[name] = eval(expr)  # numbers and 1.0 / 255.0 only
    return found


def test_header_matches_python():
    h = _header_constants()
    assert h["kAlphaMax"] == cv.ALPHA_MAX
    assert h["kAlphaMin"] == cv.ALPHA_MIN
    assert h["kTransmittanceMin"] == cv.TRANSMITTANCE_MIN
    assert h["kMedianTransmittance"] == cv.MEDIAN_TRANSMITTANCE
    assert h["kLowpassInvVariance"] == cv.LOWPASS_INV_VARIANCE
    assert h["kTileSize"] == cv.TILE_SIZE
    assert h["kRadiusMax"] == cv.RADIUS_MAX
    assert h["kEwaDilation"] == cv.EWA_DILATION


def test_rho_cutoff_is_an_exact_reject():
    # Past the cutoff even opacity 1 gives alpha < 1/255, so skipping exp there changes nothing.
    h = _header_constants()
    assert h["kRhoCutoff"] > 2 * math.log(255.0)
    assert math.exp(-0.5 * h["kRhoCutoff"]) < cv.ALPHA_MIN
