"""fdlit's FD round against an independent plain-PyTorch implementation (``shared/reference/ref_fd.py``
beside the checkout, or ``$FDLIT_REFERENCE``; skipped where it is absent). Both run identical work
(scripts/reference_parity.py: fdlit's split, initial weights and batch order handed to the
reference) and must agree round by round for AVG and sUWA."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("reference_parity", REPO / "scripts" / "reference_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parity = load_script()
REFERENCE = parity.default_reference()
pytestmark = pytest.mark.skipif(not REFERENCE.is_file(), reason=f"no reference implementation at {REFERENCE}")


@pytest.fixture(scope="module")
def ref():
    return parity.load_reference(REFERENCE)


def small_compare(ref, **settings):
    """5 clients x 2 classes (the reference's disjoint class blocks cover all 10), 3 rounds."""
    return parity.compare(ref, {**parity.MATCHED, **settings}, seed=1, clients=5, k=2, rounds=3, first_epochs=2,
                          epochs=1, public_size=200)


def test_avg_and_suwa_match_the_reference_round_by_round(ref):
    result = small_compare(ref)
    for agg in ("avg", "suwa"):
        ours, theirs = result[agg]["fdlit"], result[agg]["reference"]
        assert len(ours) == len(theirs) == 3
        for a, b in zip(ours, theirs, strict=True):
            assert a["acc"] == pytest.approx(b["acc"], abs=1e-6), (agg, a, b)
            assert a["teacher"] == pytest.approx(b["teacher"], abs=1e-6), (agg, a, b)
            assert a["chi"] == pytest.approx(b["chi"], rel=1e-4), (agg, a, b)
    # the density path really ran: sUWA's weights are not AVG's (chi = 1/M) and its clients differ
    assert all(r["chi"] > 1 / 5 + 0.05 for r in result["suwa"]["fdlit"])
    assert result["avg"]["fdlit"][0]["chi"] == pytest.approx(1 / 5)
    assert [r["acc"] for r in result["avg"]["fdlit"]] != [r["acc"] for r in result["suwa"]["fdlit"]]

