"""How the report names a run's method: the class's own ``label``, found among fdlit's methods by
name; a class path from a run folder is never imported."""

import sys

import pytest

import fdlit.methods
from fdlit.methods.base import Aggregator
from fdlit.reporting import method_label


def labelled(class_path, **init_args):
    return method_label({"aggregator": {"class_path": class_path, "init_args": init_args}})


def test_every_exported_method_is_labelled_by_its_own_label():
    methods = [getattr(fdlit.methods, n) for n in fdlit.methods.__all__]
    methods = [c for c in methods if isinstance(c, type) and issubclass(c, Aggregator) and c is not Aggregator]
    assert len(methods) > 20
    for cls in methods:
        assert labelled(f"fdlit.methods.{cls.__name__}") == (cls.label or cls.__name__)
        assert labelled(f"{cls.__module__}.{cls.__name__}") == (cls.label or cls.__name__)  # its own module
    assert labelled("fdlit.methods.ProbabilityAveraging") == "AVG"
    assert labelled("fdlit.methods.FedAvg") == "FedAvg"
    assert labelled("fdlit.methods.SmoothedUncertaintyWeighted", tau=0.5) == "sUWA τ=0.5"
    assert labelled("fdlit.methods.SmoothedUncertaintyWeighted", tau=0.0) == "AVG (sUWA τ=0)"
    assert labelled("fdlit.methods.SmoothedUncertaintyWeighted", tau=1) == "UWA (sUWA τ=1)"


def test_a_class_of_no_label_is_named_by_its_class(monkeypatch):
    monkeypatch.setattr(fdlit.methods.Krum, "label", None)
    assert labelled("fdlit.methods.Krum") == "Krum"


def test_a_foreign_class_path_is_labelled_as_text_and_never_imported(tmp_path, monkeypatch):
    touched = tmp_path / "imported"
    (tmp_path / "evilmod.py").write_text(f"open({str(touched)!r}, 'w').write('ran')\nclass Net: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert labelled("evilmod.Net") == "Net"
    assert labelled("evilmod.ProbabilityAveraging") == "ProbabilityAveraging"  # not fdlit's: not AVG
    assert labelled("evilmod.SmoothedUncertaintyWeighted", tau=0.5) == "SmoothedUncertaintyWeighted"
    assert not touched.exists() and "evilmod" not in sys.modules


@pytest.mark.parametrize("aggregator", [None, 3, ["a"], {"class_path": {"nested": 1}}, {"init_args": {}}])
def test_an_aggregator_that_is_not_a_class_path_still_gets_a_label(aggregator):
    assert isinstance(method_label({"aggregator": aggregator}), str)
