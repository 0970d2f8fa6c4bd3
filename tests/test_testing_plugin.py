"""radixserve.testing in inner pytest sessions: the ini option, the marker, one engine per model
per session closed at the end, nothing loaded for sessions that do not ask, and loading the
plugin twice (entry point and -p) is harmless.

Inner sessions run in a subprocess: pytester drops the modules an in-process run imported, and
importing them again in the next run breaks (transformers' lazy imports, a crash in hypothesis).
A conftest in each inner session records the Engines made and closed. `-p radixserve.testing` is
passed explicitly so the runs do not depend on install state.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from radixserve.model.model_cache import CACHE_ENV, cache_root

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "radixserve.testing")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_example_agent.py"
MODEL_CACHE = str(cache_root())  # read before pytester points HOME at a temporary folder


@pytest.fixture(autouse=True)
def keep_the_model_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner sessions load the converted embedded model instead of converting it again (~20 s)."""
    monkeypatch.setenv(CACHE_ENV, MODEL_CACHE)


SPY_CONFTEST = """
import json
import os
from pathlib import Path

from radixserve import blocking as engine_module

seen = {"created": [], "closed": []}
_init, _close = engine_module.Engine.__init__, engine_module.Engine.close


def _spy_init(self, config=None, **kw):
    seen["created"].append(config.model if config else kw.get("model"))
    _init(self, config, **kw)


def _spy_close(self):
    seen["closed"].append(self.engine.config.model)
    _close(self)


engine_module.Engine.__init__, engine_module.Engine.close = _spy_init, _spy_close


def pytest_unconfigure(config):  # after the session's fixtures are torn down
    engine_module.Engine.__init__, engine_module.Engine.close = _init, _close
    Path("engines.json").write_text(json.dumps(seen))
"""


def engines_seen(pytester: pytest.Pytester) -> dict[str, list[str]]:
    """The models of the Engines the inner session created and closed (see SPY_CONFTEST)."""
    seen: dict[str, list[str]] = json.loads((pytester.path / "engines.json").read_text())
    return seen


def only_our_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's fast start: no installed plugin autoloaded (hypothesis' alone is ~1 s), only `-p`."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_ini_option_picks_the_model_and_the_example_agent_test_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    only_our_plugin(monkeypatch)
    ini = {
        "radixserve_model": "smollm2-135m-instruct",
        "radixserve_device": "cpu",
        "radixserve_max_tokens": 7,
    }
    pytester.makeini("[pytest]\n" + "".join(f"{k} = {v}\n" for k, v in ini.items()))
    pytester.makepyfile(test_example_agent=EXAMPLE.read_text())
    pytester.makepyfile(
        test_ini="""
        def test_configured(radixserve_engine, radixserve_params):
            assert radixserve_engine.engine.config.model == "smollm2-135m-instruct"
            assert radixserve_engine.engine.config.device == "cpu"
            assert radixserve_params.temperature == 0 and radixserve_params.max_tokens == 7
            out = radixserve_engine.complete("The capital of France is", radixserve_params)
            assert out.text and len(out.token_ids) <= 7
        """
    )
    pytester.makeconftest(SPY_CONFTEST)
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=6)
    seen = engines_seen(pytester)
    assert seen["created"] == ["smollm2-135m-instruct"]  # shared by all six tests
    assert seen["closed"] == ["smollm2-135m-instruct"]  # at the end of the session


def test_marker_overrides_the_ini_option(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    only_our_plugin(monkeypatch)
    pytester.makeini("[pytest]\nradixserve_model = /no/such/model\nradixserve_max_tokens = 4\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.radixserve(model="dummy:smollm2-135m")
        def test_marked(radixserve_engine, radixserve_params):
            assert radixserve_engine.engine.config.model == "dummy:smollm2-135m"
            first = radixserve_engine.complete("Hello", radixserve_params)
            again = radixserve_engine.complete("Hello", radixserve_params)
            assert first.finished and again.token_ids == first.token_ids  # greedy

        @pytest.mark.radixserve("dummy:smollm2-135m")
        def test_marked_positionally(radixserve_engine):
            assert radixserve_engine.engine.config.model == "dummy:smollm2-135m"

        def test_unmarked_uses_the_ini_model(radixserve_engine):
            pass

        def test_unmarked_again(radixserve_engine):
            pass
        """
    )
    pytester.makeconftest(SPY_CONFTEST)
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*radixserve: cannot start model '/no/such/model' on cpu: *"])
    assert "Traceback" not in result.stdout.str() and "During handling" not in result.stdout.str()
    # One dummy engine for both marked tests; the failing model is tried once, not per test.
    seen = engines_seen(pytester)
    assert sorted(seen["created"]) == ["/no/such/model", "dummy:smollm2-135m"]
    assert seen["closed"] == ["dummy:smollm2-135m"]


def test_unused_plugin_loads_nothing_and_may_be_loaded_twice(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed (a pytest11 entry point named like the module) and given with -p: registered once;
    a session whose tests do not ask for an engine creates none."""
    dist = pytester.mkdir("site") / "radixserve_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: radixserve-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nradixserve.testing = radixserve.testing\n")
    pytester.makeconftest(SPY_CONFTEST)
    pytester.makepyfile(
        """
        import radixserve.testing

        def test_registered_once(pytestconfig):
            plugins = pytestconfig.pluginmanager.get_plugins()
            assert sum(p is radixserve.testing for p in plugins) == 1
            assert pytestconfig.getini("radixserve_model") == "smollm2-135m-instruct"
            assert any(m.startswith("radixserve(") for m in pytestconfig.getini("markers"))
        """
    )
    env_path = os.pathsep.join(filter(None, [str(dist.parent), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", env_path)
    pytester.runpytest_subprocess(*PLUGIN, "--strict-markers").assert_outcomes(passed=1)
    assert engines_seen(pytester) == {"created": [], "closed": []}
