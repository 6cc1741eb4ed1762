"""A plugin adds a model (tests/fwbench_plugin_model): registered with register_model, implemented in torch and
jax inside the plugin's own package under the same model-file contract, found through the registry by the
built-in runtimes and by a plugin runtime whose framework package is the plugin's. Its sweep through the CLI (a
worker per runtime) is the matrix's (``make test-matrix``); ``make test`` runs a plugin's runtime through the CLI in
tests/test_checklists.py."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fwbench.frameworks as registry
import fwbench.models as models
from conftest import loaded_model_plugin, run_args, run_cli
from fwbench.frameworks.roles import (
    ArchModule,
    ModelFileError,
    TrainingArch,
    as_arch,
    as_training_arch,
    builtin_package,
    layout_of,
    require,
)

PLUGIN = "fwbench_plugin_model"
RUNTIMES = ("torch:eager", "jax:jit", "pluginfw:torch")  # built-in torch and jax, and the plugin's framework


@pytest.fixture
def plugin_model_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The plugin loaded here (the registries restored afterwards) and named for every subprocess."""
    yield from loaded_model_plugin(monkeypatch, PLUGIN)


def test_the_plugin_model_is_registered_and_its_files_are_found_without_importing_them(
    plugin_model_env: dict[str, str],
) -> None:
    description = models.get_model("plugin-mlp")
    assert "plugin-mlp" in models.model_names() and description.arch == "plugin_mlp"
    assert registry.arch_module_name(builtin_package("torch"), "plugin_mlp") == f"{PLUGIN}.torch.plugin_mlp"
    assert registry.arch_module_name(builtin_package("jax"), "plugin_mlp") == f"{PLUGIN}.jax.plugin_mlp"
    plugin_runtime = registry.get_runtime("pluginfw:torch")
    assert plugin_runtime.framework_package == f"{PLUGIN}.torch"
    for name in RUNTIMES:
        assert registry.missing_implementation(registry.get_runtime(name), "plugin_mlp") is None, name
    assert (
        registry.missing_implementation(registry.get_runtime("tensorflow:function"), "plugin_mlp")
        == "no tensorflow implementation of plugin_mlp yet"
    )
    assert (
        registry.missing_implementation(registry.get_runtime("keras:jax"), "plugin_mlp")
        == "no keras implementation of plugin_mlp yet"
    )
    # the built-in models are still looked up in the framework packages
    assert registry.arch_module_name(builtin_package("jax"), "mlp") == "fwbench.frameworks.jax.mlp"
    assert registry.missing_implementation(plugin_runtime, "mlp") == "no pluginfw implementation of mlp yet"
    assert not {f"{PLUGIN}.torch.plugin_mlp", f"{PLUGIN}.jax.plugin_mlp"} & set(sys.modules)
    assert (
        registry.dtype_unsupported(plugin_runtime, "bf16")
        == "pluginfw:torch cannot compute in bf16 (it computes in fp32)"
    )


def test_a_model_name_is_registered_once(plugin_model_env: dict[str, str]) -> None:
    from fwbench_plugin_model import PluginMLP

    models.register_model(models.get_model("plugin-mlp"))  # the same description again: a no-op
    with pytest.raises(ValueError, match="'plugin-mlp' is already registered"):
        models.register_model(PluginMLP())


def test_a_model_file_that_breaks_the_contract_is_named_with_what_it_lacks() -> None:
    module = types.ModuleType("somewhere.torch.brokenarch")
    with pytest.raises(ModelFileError, match=r"somewhere.torch.brokenarch does not provide build_model \(ArchModule"):
        as_arch(module)
    vars(module).update(build_model=lambda description, weights, device: None)
    require(module, ArchModule)
    with pytest.raises(ModelFileError, match=r"does not provide training_logits \(TrainingArch: The training forward"):
        as_training_arch(module)
    assert layout_of(module) is None
    vars(module).update(LAYOUT="NCHW", training_logits=lambda model, *inputs: None)
    require(module, TrainingArch)
    assert layout_of(module) == "NCHW"


def test_the_plugin_model_trains_alike_in_torch_and_jax(plugin_model_env: dict[str, str]) -> None:
    """One optimizer step through each backend's training path (the plugin files' training_logits, the
    weights module read back by trained_parameters): the float64 reference loss, and the same parameters."""
    from fwbench.spec import Settings

    description = models.get_model("plugin-mlp")
    weights = description.canonical_weights(0)
    arrays = description.make_inputs(4, None, 0)
    targets = description.make_targets(4, None, 0)
    expected = description.reference_loss(weights, arrays, targets)
    assert expected is not None
    trained: dict[str, dict[str, np.ndarray]] = {}
    for runtime in RUNTIMES[:2]:
        backend = registry.create_backend(runtime, "cpu", Settings(threads=1), phase="training")
        assert backend.phase == "training"
        backend.build(description, weights)
        step = backend.make_train_step(backend.make_inputs(arrays), backend.make_targets(targets))
        loss = backend.loss_value(step())
        assert abs(loss - expected) <= 1e-5 * abs(expected), runtime
        trained[runtime] = backend.trained_parameters()
    torch_params, jax_params = trained["torch:eager"], trained["jax:jit"]
    assert set(torch_params) == set(jax_params) == set(weights)
    for name, value in torch_params.items():
        assert not np.array_equal(value, weights[name]), name  # the step moved every tensor
        np.testing.assert_allclose(jax_params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.matrix
def test_the_plugin_model_runs_end_to_end_with_parity(plugin_model_env: dict[str, str], db_path: Path) -> None:
    result = run_cli(
        *run_args(
            *("--models", "plugin-mlp", "--runtimes", ",".join((*RUNTIMES, "tensorflow:function"))),
            *("--batch-sizes", "2"),
            db=db_path,
            max_time=0.3,
        ),
        env=plugin_model_env,
    )
    assert result.returncode == 0, result.stderr
    exported = run_cli("report", "--db", str(db_path), "--format", "json", env=plugin_model_env)
    assert exported.returncode == 0, exported.stderr
    rows: dict[str, dict[str, Any]] = {row["runtime"]: row for row in json.loads(exported.stdout)["results"]}
    assert set(rows) == {*RUNTIMES, "tensorflow:function"}
    for runtime in RUNTIMES:
        row = rows[runtime]
        assert row["model"] == "plugin-mlp" and row["status"] == "ok", (runtime, row["reason"])
        parity = row["details"]["parity"]
        assert parity["ok"] and parity["reference"] == "numpy-float64", runtime
        assert parity["outputs"]["logits"]["rel_l2"] < parity["tolerance_rel_l2"], runtime
    skipped = rows["tensorflow:function"]
    assert skipped["status"] == "skipped" and skipped["reason"] == "no tensorflow implementation of plugin_mlp yet"


def test_the_planner_skips_a_dtype_the_runtime_does_not_declare(plugin_model_env: dict[str, str]) -> None:
    """pluginfw:torch declares fp32 only: a bf16 plan keeps its cell as skipped, with the registry's reason."""
    from fwbench.runner.planner import build_plan
    from fwbench.spec import Settings

    plan = build_plan(["plugin-mlp"], ["pluginfw:torch", "torch:eager"], [2], [], Settings(), dtype="bf16")
    assert [c.runtime for c in plan.cases] == ["torch:eager"]
    (skipped,) = plan.skipped
    assert (
        skipped.case.runtime == "pluginfw:torch"
        and skipped.reason == "pluginfw:torch cannot compute in bf16 (it computes in fp32)"
    )
