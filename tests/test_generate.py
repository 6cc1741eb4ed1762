"""Phase generate: greedy decoding with a key/value cache gives the float64 reference's tokens in every framework
(gpt2-tiny and llama-tiny), a near tie is marked and never fails a correct runtime, an injected cache defect is a
mismatch naming its step, a decode step that recompiles is flagged, bad arguments are refused with one line.
``make test``: torch:eager, tensorflow:function and jax:jit (its compiled loop too) on both decoders, onnxruntime:torch
(the exported decoder step), keras:jax (the model's own Keras layers over a functional cache) and
openvino-genai:torch (OpenVINO GenAI's loop over the export made stateful) on llama-tiny, onnxruntime-genai:torch
(GenAI's own loop) on gpt2-tiny; the matrix (MATRIX_CELLS): the other compiled modes, openvino:torch, Keras' other
backends and keras:jax and openvino-genai:torch on the other decoder, one cell each."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers

from conftest import fwbench_here, loaded_model_plugin, run_args
from fwbench.models import get_model
from fwbench.models.decoder import CausalDecoder
from fwbench.models.generation import check_tokens, generation_weights, prompt_ids, reference_greedy, reference_logits
from fwbench.runner.manager import run_worker
from fwbench.runner.phases.generate import BLOCKS_PER_ROUND
from fwbench.spec import Case, Settings
from fwbench.store import Store
from hf_oracles import hf_causal_lm

BATCH, PROMPT, NEW = 2, 12, 6
SETTINGS = Settings(threads=1, max_time_s=0.2, new_tokens=NEW)
DEFAULT_RUNTIMES = ("torch:eager", "tensorflow:function", "jax:jit")  # each on gpt2-tiny and llama-tiny
# each on one model (its compiles and exports are the slow part): the decoders' cache code is the same file as the
# default runtimes' (the engines run torch's, exported)
DEFAULT_CELLS = (
    ("onnxruntime:torch", "llama-tiny"), ("onnxruntime-genai:torch", "gpt2-tiny"), ("keras:jax", "llama-tiny"),
    ("openvino-genai:torch", "llama-tiny"),
)  # fmt: skip
# every other runtime, once each (keras:jax and openvino-genai:torch: make test's; Keras' GPT-2 decoder runs in
# keras:torch, OpenVINO's GPT-2 export in openvino:torch)
MATRIX_CELLS = (
    ("torch:compile", "llama-tiny"), ("tensorflow:eager", "llama-tiny"), ("tensorflow:xla", "gpt2-tiny"),
    ("openvino:torch", "gpt2-tiny"), ("keras:tensorflow", "llama-tiny"), ("keras:torch", "gpt2-tiny"),
)  # fmt: skip
ENGINES = ("onnxruntime:torch", "openvino:torch", "onnxruntime-genai:torch", "openvino-genai:torch")
WHOLE_LOOPS = ("openvino-genai:torch",)  # a whole generation per call, timed by its own clock, no logits


def decoder(name: str) -> CausalDecoder:
    description = get_model(name)
    assert isinstance(description, CausalDecoder)
    return description


def greedy_tokens(name: str) -> np.ndarray:
    """The float64 reference's own greedy tokens (BATCH, NEW) for the cells' prompt and weights."""
    description = decoder(name)
    weights = generation_weights(description, SETTINGS.seed)
    return reference_greedy(description, weights, prompt_ids(description, BATCH, PROMPT, SETTINGS.seed), NEW)


def generated(name: str, runtime: str) -> dict[str, Any]:
    """One generate cell in its own worker: its outcome's details (status ok asserted)."""
    outcome = run_worker(Case(name, runtime, phase="generate", batch_size=BATCH, seq_len=PROMPT), SETTINGS)
    assert outcome.status == "ok", outcome.reason
    return outcome.details


# -- the token check, without a framework --------------------------------------------------------------------------
def logits_with(best: int, second: int, gap: float, vocab: int = 8) -> np.ndarray:
    """One row of logits (vocab,) whose argmax is ``best``, ``gap`` above ``second``, the rest far below."""
    row = np.full(vocab, -5.0)
    row[best], row[second] = 1.0, 1.0 - gap
    return row


def test_a_near_tie_is_marked_and_the_check_goes_on_from_the_prefix_the_runtime_took() -> None:
    tolerance = 1e-4
    tied = logits_with(best=3, second=5, gap=1e-6)  # far within √2 · 1e-4 · ‖logits‖
    clear = logits_with(best=2, second=4, gap=0.5)
    reference = np.stack([np.stack([tied, clear])])  # (batch 1, steps 2, vocab)
    runtime = reference.copy()
    runtime[0, 0, [3, 5]] = runtime[0, 0, [5, 3]]  # its error (1e-6) swaps the tie: it takes token 5
    check = check_tokens(np.array([[5, 2]]), runtime, reference, tolerance)
    assert check.ok and check.first_mismatch is None
    assert check.near_ties == [{"step": 0, "row": 0, "took_the_other": True}]
    assert check.first_differing_step == 0
    # the same swap where the logits were clearly apart is a mismatch at that step and row
    wrong = check_tokens(np.array([[2, 4]]), reference, reference, tolerance)
    assert not wrong.ok and wrong.first_mismatch is not None
    assert (wrong.first_mismatch["step"], wrong.first_mismatch["row"]) == (1, 0)
    assert wrong.first_mismatch["reference_token"] == 2


def test_logits_off_by_more_than_the_tolerance_fail_even_with_the_right_tokens() -> None:
    reference = np.stack([np.stack([logits_with(1, 2, 0.5), logits_with(3, 4, 0.5)])])
    runtime = reference * 1.01  # the right argmax, a 1% error
    check = check_tokens(np.array([[1, 3]]), runtime, reference, 1e-4)
    assert not check.ok and check.first_mismatch is not None and check.first_mismatch["step"] == 0
    assert "relative error" in check.first_mismatch["why"]
    reported = check_tokens(np.array([[1, 4]]), runtime, reference, 1e-4, judged=False)  # bf16: reported only
    assert reported.ok and reported.first_differing_step == 1 and reported.step_rel_l2[0] > 1e-4


def test_openvino_genai_step_seconds_sum_a_steps_entries_per_row() -> None:
    """openvino-genai 2026.4's m_durations: each step's gap divided by the batch, once per row (so the steps add up to
    the call: a step is the sum of its rows' entries, not one of them)."""
    from fwbench.frameworks.ovgenai.backend import step_seconds

    assert step_seconds([3000.0, 3000.0, 1000.0, 1000.0], batch=2, new_tokens=3) == pytest.approx([6e-3, 2e-3])
    with pytest.raises(RuntimeError, match="3 token gaps for 2 rows of 3 tokens"):
        step_seconds([1.0, 1.0, 1.0], batch=2, new_tokens=3)


def test_a_loop_without_logits_has_its_tokens_checked_and_its_near_ties_taken_from_the_reference() -> None:
    reference = np.stack([np.stack([logits_with(3, 5, 1e-6), logits_with(2, 4, 0.5)])])  # a tie, then a clear step
    tied = check_tokens(np.array([[5, 2]]), None, reference, 1e-4)
    assert tied.ok and tied.step_rel_l2 == [] and tied.near_ties == [{"step": 0, "row": 0, "took_the_other": True}]
    wrong = check_tokens(np.array([[3, 4]]), None, reference, 1e-4)
    assert wrong.first_mismatch is not None and (wrong.first_mismatch["step"], wrong.first_mismatch["token"]) == (1, 4)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_the_reference_checks_its_own_greedy_tokens_and_the_tokens_vary(name: str) -> None:
    description = decoder(name)
    weights = generation_weights(description, SETTINGS.seed)
    prompt = prompt_ids(description, BATCH, PROMPT, SETTINGS.seed)
    tokens = greedy_tokens(name)
    logits = reference_logits(description, weights, prompt, tokens)
    assert logits.shape == (BATCH, NEW, description.config.vocab_size)
    assert (logits.argmax(axis=-1) == tokens).all()  # one cache-free forward gives every step's logits
    assert check_tokens(tokens, logits, logits, 1e-4).ok
    # generation weights: the tokens change from step to step (at the zoo's N(0, 0.02) they repeat)
    assert all(len(set(row)) >= NEW // 2 for row in tokens.tolist())


def test_a_prefill_counts_the_lm_head_of_its_last_position_only() -> None:
    """The prefill's logits are the next token's: its FLOPs are the layers' over the whole prompt and one row of the
    LM head (2·H·V) per batch row, which the roofline's prefill share divides by."""
    from fwbench.models.text import transformer_layer_flops

    gpt2 = decoder("gpt2")
    c = gpt2.config
    batch, prompt = 8, 128
    layers = c.layers * transformer_layer_flops(prompt, c.hidden, 4 * c.hidden)
    assert gpt2.prefill_flops(batch, prompt) == batch * (layers + 2 * c.hidden * c.vocab_size)
    assert gpt2.prefill_flops(batch, 1) == gpt2.forward_flops(batch, 1)  # a decode step: one position, its head


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_the_reference_tokens_are_transformers_greedy_generate_on_the_same_weights(name: str) -> None:
    """A public generation implementation on the same weights: transformers' GPT2LMHeadModel / LlamaForCausalLM
    ``generate`` (greedy, its own key/value cache, float32) gives the float64 reference's tokens."""
    import torch

    description = decoder(name)
    model = hf_causal_lm(description, generation_weights(description, SETTINGS.seed))
    prompt = torch.from_numpy(prompt_ids(description, BATCH, PROMPT, SETTINGS.seed).astype(np.int64))
    greedy = transformers.GenerationConfig(
        max_new_tokens=NEW, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0
    )
    with torch.no_grad():
        generated_ids = model.generate(  # type: ignore[operator]
            prompt, attention_mask=torch.ones_like(prompt), generation_config=greedy
        )
    np.testing.assert_array_equal(generated_ids[:, PROMPT:].numpy(), greedy_tokens(name))


# -- every framework: the same tokens ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("runtime", "names"),
    [
        *((runtime, ("gpt2-tiny", "llama-tiny")) for runtime in DEFAULT_RUNTIMES),
        *((runtime, (name,)) for runtime, name in DEFAULT_CELLS),
        *(pytest.param(runtime, (name,), marks=pytest.mark.matrix) for runtime, name in MATRIX_CELLS),
    ],
)
def test_every_framework_generates_the_reference_tokens(runtime: str, names: tuple[str, ...]) -> None:
    for name in names:
        details = generated(name, runtime)
        tokens = details["parity"]["tokens"]
        assert tokens["ok"] and tokens["judged"] and tokens["steps"] == NEW
        expected = greedy_tokens(name)
        took_other = {(t["step"], t["row"]) for t in tokens["near_ties"] if t["took_the_other"]}
        got = np.array(details["generation"]["tokens"])
        if not took_other:  # a near tie may take the other token, and the rest follows from it
            np.testing.assert_array_equal(got, expected)
        generation = details["generation"]
        assert len(generation["decode_step_s_by_position"]) == NEW - 1
        assert generation["timed_generations"] >= 1 and generation["ttft_p50_s"] > 0
        assert generation["tokens_per_s"] > 0
        compiles = generation["compiles_in_first_generation"]
        # a compiling runtime compiles the prefill and the decode step once each, not per step
        assert all(n <= 2 for key, n in compiles.items() if key in ("compiles", "traces"))
        assert not details["compile_health"]["recompiled_in_timed_loop"]
        loop = generation["compiled_loop"]
        assert (loop is not None) == (runtime == "jax:jit")
        if loop is not None:
            assert loop["same_tokens"] and len(loop["loop_s"]) >= 1
        if runtime in WHOLE_LOOPS:  # its tokens checked without logits; its steps timed by its own clock
            assert tokens["step_rel_l2"] == [] and "no logits" in details["parity"]["checked"]
            assert "own clock" in generation["timed_by"]
        else:
            assert len(tokens["step_rel_l2"]) == NEW and "timed_by" not in generation
        if runtime in ENGINES:  # one export, its axes free: the prefill's and every decode step's shapes, any cell's
            assert "axes free" in details["compile_report"]["exporter"] and "reexports" not in details["compile_report"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime", ["torch:eager", *(pytest.param(r, marks=pytest.mark.matrix) for r in ("jax:jit", "tensorflow:xla"))]
)
def test_bf16_generation_reports_where_its_tokens_part_and_is_not_failed_for_it(runtime: str) -> None:
    case = Case("llama-tiny", runtime, phase="generate", batch_size=BATCH, seq_len=PROMPT, dtype="bf16")
    outcome = run_worker(case, SETTINGS)
    assert outcome.status == "ok", outcome.reason
    tokens = outcome.details["parity"]["tokens"]
    assert tokens["judged"] is False and tokens["ok"] is True and tokens["first_mismatch"] is None
    assert len(tokens["step_rel_l2"]) == NEW
    assert all(0 < error < 1 for error in tokens["step_rel_l2"])  # bfloat16's rounding shows, and nothing broke
    differs = tokens["first_differing_step"]
    assert differs is None or 0 <= differs < NEW


@pytest.fixture
def stale_cache_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The test plugin model llama-tiny-stale-cache (tests/fwbench_cache_defect) loaded here and in every worker."""
    yield from loaded_model_plugin(monkeypatch, "fwbench_cache_defect")


@pytest.mark.slow
def test_a_cache_defect_is_a_mismatch_that_names_its_first_step(stale_cache_env: dict[str, str]) -> None:
    from fwbench_cache_defect import FIRST_WRONG_STEP, MODEL

    case = Case(MODEL, "torch:eager", phase="generate", batch_size=BATCH, seq_len=PROMPT)
    outcome = run_worker(case, SETTINGS)
    assert outcome.status == "mismatch"
    assert outcome.reason is not None and outcome.reason.startswith(f"generation step {FIRST_WRONG_STEP}")
    check = outcome.details["parity"]["tokens"]
    assert check["first_mismatch"]["step"] == FIRST_WRONG_STEP
    assert check["step_rel_l2"][0] <= check["tolerance_rel_l2"]  # the prefill was right


@pytest.mark.slow
def test_a_decode_step_that_recompiles_is_flagged(plugin_env: dict[str, str]) -> None:
    outcome = run_worker(
        Case("llama-tiny", "retrace:torch", phase="generate", batch_size=BATCH, seq_len=PROMPT), SETTINGS
    )
    assert outcome.status == "ok", outcome.reason
    compiles = outcome.details["generation"]["compiles_in_first_generation"]["compiles"]
    assert compiles > 2  # the prefill and every decode position of the first generation, each compiled
    health = outcome.details["compile_health"]
    assert health["recompiled_per_decode_step"] is True
    assert any("decode recompiles per step" in flag for flag in health["flags"])


# -- the command line ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--new-tokens", "0"], "--new-tokens: '0' is not a positive integer"),
        (["--prompt-lens", "1020"], "need 1052 positions; gpt2-tiny has 1024"),
        (["--runtimes", "torch:script"], "torch:script has no generate phase"),
        (["--models", "bert-tiny"], "bert-tiny is not a causal decoder"),
    ],
)
def test_bad_generate_arguments_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], message: str
) -> None:
    chosen = {"--models": "gpt2-tiny", "--runtimes": "torch:eager", "--prompt-lens": "8"}
    chosen.update(zip(flags[::2], flags[1::2], strict=True))
    args = [item for pair in chosen.items() for item in pair]
    code, out, err = fwbench_here(capsys, *run_args("--phase", "generate", *args, db=tmp_path / "r.db"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "r.db").exists() or not Store.open(tmp_path / "r.db", readonly=True).results()


def test_list_says_which_runtimes_generate_and_why_the_others_do_not(capsys: pytest.CaptureFixture[str]) -> None:
    from fwbench.frameworks import runtimes

    lacking = {
        name: info.no_generate
        for name, info in runtimes().items()
        if "inference" in info.phases
        and "generate" not in info.phases
        and not info.unavailable
        and (info.module or info.external).startswith("fwbench.frameworks.")  # built in (not a test plugin's)
    }
    assert lacking and all(lacking.values()), "a built-in inference runtime without phase generate must say why"
    code, out, _ = fwbench_here(capsys, "list")
    assert code == 0
    text = out[out.index("--phase generate") :]
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") >= 3}
    assert "yes" in rows["keras:jax"] and "yes" in rows["onnxruntime-genai:torch"]
    assert "no: tf2onnx converts" in rows["onnxruntime:tensorflow"]


@pytest.mark.slow
def test_a_generate_run_is_stored_and_reported_with_its_own_table_and_plot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "generate.db"
    flags = ("--phase", "generate", "--models", "llama-tiny", "--runtimes", "torch:eager,jax:jit")
    code, out, err = fwbench_here(
        capsys, *run_args(*flags, "--batch-sizes", "1", "--prompt-lens", "8", "--new-tokens", "4", db=db, max_time=0.2)
    )
    assert code == 0, err
    assert "Text generation" in out and "TTFT" in out
    with Store.open(db, readonly=True) as store:
        rows = store.results()
    assert {row.status for row in rows} == {"ok"} and len(rows) == 2
    for row in rows:
        assert row.generation is not None and row.generation.new_tokens == 4 and len(row.generation.rounds) == 1
        assert len(row.generation.rounds[0].decode_step_s_by_position) == 3
        # interleaved, a block is one generation and the calibration called none
        generation = row.details["generation"]
        assert generation["timed_generations"] == BLOCKS_PER_ROUND
        assert generation["generations_called"] == row.details["warmup_calls"] + BLOCKS_PER_ROUND
    code, _, err = fwbench_here(
        capsys, "report", "--db", str(db), "--run", "latest", "--html", str(tmp_path / "r.html")
    )
    assert code == 0, err
    page = (tmp_path / "r.html").read_text()
    section = page[page.index('<section id="generate">') :]
    assert "decode latency against the position" in section and section.count("<img") >= 1


@pytest.mark.slow
def test_an_engine_exports_the_decoder_step_once_per_model_for_every_group_of_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from fwbench.frameworks.base import MODEL_EXPORT_CACHE_ENV

    db = tmp_path / "generate.db"
    before = os.environ.get(MODEL_EXPORT_CACHE_ENV)
    flags = ("--phase", "generate", "--models", "llama-tiny", "--runtimes", "onnxruntime:torch,onnxruntime-genai:torch")
    code, _, err = fwbench_here(
        capsys,
        *run_args(*flags, "--batch-sizes", "1,2", "--prompt-lens", "8", "--new-tokens", "3", db=db, max_time=0.2),
    )
    assert code == 0, err
    assert os.environ.get(MODEL_EXPORT_CACHE_ENV) == before  # the run's cache lived as long as the run
    with Store.open(db, readonly=True) as store:
        rows = store.results()
    assert {row.status for row in rows} == {"ok"} and {row.batch_size for row in rows} == {1, 2}
    for runtime in ("onnxruntime:torch", "onnxruntime-genai:torch"):
        reports = [row.details["compile_report"] for row in rows if row.runtime == runtime]
        # two comparison groups (one per batch), one export: the later group's worker loaded the earlier one's file
        assert sorted(bool(report.get("cached")) for report in reports) == [False, True]
        assert reports[0]["export_s"] == reports[1]["export_s"]


# -- the roofline: decode against the memory bandwidth, the prefill against the FLOP peak ---------------------------
def test_decode_is_reported_as_a_share_of_the_bandwidth_and_the_prefill_of_the_flop_peak(tmp_path: Path) -> None:
    from fwbench.measure.bandwidth import copy_bandwidth
    from fwbench.report.generation import generation_rows
    from fwbench.report.peak import BANDWIDTH_KEY, PEAK_SUITE, latest_peak
    from fwbench.spec import Plan

    measured = copy_bandwidth([0], array_bytes=8 * 2**20, repeats=2)  # a real copy, small: its figure is not judged
    assert measured.bytes_per_s > 0 and len(measured.repeats_bytes_per_s) == 2 and measured.cpus == (0,)
    gemm_flops, bandwidth = 2 * 3072**3, 40e9
    description = decoder("gpt2")
    step_bytes = description.decode_step_bytes(1, 128)
    # every weight once (the position table's and the token table's rows aside: the token table is read whole as the
    # tied LM head), and the cache of 129 positions
    assert step_bytes == 4 * (description.parameter_count() - 1024 * 768 + 768 + 2 * 12 * 768 * 129)
    generation = {
        "prompt_len": 128, "new_tokens": 32, "decode_step_bytes": float(step_bytes), "prefill_flops": 10**10,
        "ttft_p50_s": 0.1, "decode_p50_s": 0.025, "decode_p90_s": 0.03, "tokens_per_s": 35.0,
    }  # fmt: skip
    with Store.open(tmp_path / "db.sqlite") as store:
        for suite, case, fields, details, environment in (
            (PEAK_SUITE, Case("gemm", "torch:eager", batch_size=3072), {"flops": gemm_flops, "median_s": 0.5}, {},
             {BANDWIDTH_KEY: {"bytes_per_s": bandwidth}}),
            (None, Case("gpt2", "jax:jit", phase="generate", batch_size=1, seq_len=128), {"flops": 1, "median_s": 1.0},
             {"generation": generation}, {}),
        ):  # fmt: skip
            run_id = store.create_run(Plan((case,), Settings(threads=2), suite=suite), "test", environment, "0")
            store.add_result(
                run_id, case, {"status": "ok", "threads": 2, "calls_per_sample": 1, **fields}, [1.0], details
            )
            store.finish_run(run_id)
        peak = latest_peak(store)
        assert peak is not None and peak.bandwidth_bytes_per_s == bandwidth
        (row,) = generation_rows(store.results([run_id]), peak)
    assert row.decode_bandwidth_share == pytest.approx(step_bytes / 0.025 / bandwidth)
    assert row.prefill_peak_share == pytest.approx(10**10 / 0.1 / (gemm_flops / 0.5))
    assert generation_rows([row.row], None)[0].decode_bandwidth_share is None  # no peak measured: no share
