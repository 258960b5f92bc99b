"""ctxkit.fast.plan: one vocabulary for speed.

Parsing and writing plans back, every interaction rule of ``validate``, how ``auto``
resolves on a CPU and on GPUs this machine does not have (a made-up DeviceInfo, and
torch.cuda patched as a GPU would answer), the kernel registry's reasons, the CLI
round-trip of ``--fast``, and that each preset computes what ``reference`` computes
(against float64, within the dtype's rounding: tests/tolerance.py).
"""

import copy
import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch

from ctxkit.core.errors import UserError
from ctxkit.fast import DeviceInfo, FastPlan, PRESETS, apply, resolve, supported
from ctxkit.fast import kernels
from ctxkit.fast.plan import OPTIONS, USES
from ctxkit.models import BertModel, get_preset
from tolerance import assert_close_to_reference, float64

H100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100 80GB HBM3")
A100 = DeviceInfo("cuda", (8, 0), "NVIDIA A100-SXM4-40GB")


@pytest.fixture
def triton_installed(monkeypatch):
    """The registry answers as on a GPU machine with the gpu extra (Triton >= 3.4)."""
    monkeypatch.setattr(kernels, "has_package", lambda name: True)
    monkeypatch.setattr(kernels, "_tensor_descriptors", lambda: None)
    monkeypatch.setitem(kernels.KERNELS, "gelu_gemm", dataclasses.replace(kernels.KERNELS["gelu_gemm"], check=None))
    monkeypatch.setitem(kernels.KERNELS, "fp8_gemm", dataclasses.replace(kernels.KERNELS["fp8_gemm"], check=None))
    kernels.clear_cache()
    yield
    kernels.clear_cache()


@pytest.fixture
def no_triton(monkeypatch):
    monkeypatch.setattr(kernels, "has_package", lambda name: False)
    kernels.clear_cache()
    yield
    kernels.clear_cache()


# ---------------------------------------------------------------------- reading and writing


@pytest.mark.parametrize("text, canonical", [
    ("reference", "reference"),
    ("auto", "auto"),
    ("auto-compile+ckpt", "auto-compile+ckpt"),
    ("pretrain", "graphs+compile+normsplit64+qkv+qkvpack+gelugemm+maskdrop+bf16res+master+pack"),
    ("pretrain-compile", "graphs+qkv+qkvpack+gelugemm+maskdrop+bf16res+master+pack"),  # normsplit goes with compile
    ("pretrain-qkv", "graphs+compile+normsplit64+gelugemm+maskdrop+bf16res+master+pack"),  # qkvpack goes with qkv
    ("qkvpack", "qkv+qkvpack"),  # qkvpack implies qkv
    ("graphs+qkv", "graphs+qkv"),
    ("infer+fp8norm", "graphs+compile+qkv+gelugemm+fp8norm"),
    ("infer+gelutanh", "graphs+compile+qkv+gelutanh"),  # one GELU form: tanh replaces gemm
    ("GRAPHS + QKV", "graphs+qkv"),
    ("compile+seg2+normsplit128", "compile+seg2+normsplit128"),
])
def test_parse_writes_back_the_canonical_form(text, canonical):
    plan = FastPlan.parse(text)
    assert str(plan) == canonical
    assert FastPlan.parse(str(plan)) == plan  # a round trip changes nothing


def test_every_option_and_preset_parses():
    for option in OPTIONS:
        token = f"{option.token}2" if option.token in ("seg", "normsplit") else option.token
        assert token in str(FastPlan.parse(token)) or option.needs  # alone, or with what it needs
        assert getattr(FastPlan.parse(token), option.field) != getattr(FastPlan(), option.field)
    for name, text in PRESETS.items():
        assert FastPlan.parse(name) == (FastPlan.parse(text) if text else FastPlan())


@pytest.mark.parametrize("text, message", [
    ("auto+gelugem", "unknown option 'gelugem' (did you mean gelugemm?)"),
    ("graphs+pretrain", "presets go first"),
    ("-compile", "start with a preset"),
    ("auto+seg", "seg takes a number"),
    ("", "empty fast plan"),
    ("auto++qkv", "preset+option-option"),
])
def test_bad_plans_are_refused_with_a_hint(text, message):
    with pytest.raises(UserError, match=re.escape(message)):
        FastPlan.parse(text)


def test_for_use_keeps_only_what_has_an_effect():
    pretrain = FastPlan.parse("pretrain+ckpt")
    assert str(pretrain.for_use("infer")) == "graphs+compile+qkv+gelugemm"
    assert str(pretrain.for_use("decode")) == "graphs+compile+qkv"
    assert pretrain.for_use("pretrain") == pretrain
    assert str(FastPlan.parse("decode").for_use("train")) == "graphs+compile+qkv"


# ---------------------------------------------------------------------- rules


@pytest.mark.parametrize("text, context, problem", [
    ("graphs+seg2", {}, "seg2 needs compile"),
    ("compile+normsplit48", {}, "power of two"),
    ("qkv+fp8train", {"use": "pretrain"}, "fp8train keeps three float8 q/k/v GEMMs and its own weights: drop qkv"),
    ("master", {"use": "train", "precision": "fp32"}, "master: precision is fp32"),
    ("master", {"use": "train", "precision": "bf16", "optimizer": "lamb"}, "master: the optimizer is lamb"),
    ("master", {"use": "train", "precision": "bf16", "world_size": 2}, "master: 2 ranks"),
    ("graphs", {"use": "train", "device": "cpu"}, "graphs need a CUDA GPU"),
    ("graphs", {"use": "train", "device": H100, "grad_accum": 4}, "graphs need grad_accum 1"),
    ("graphs", {"use": "train", "device": H100, "optimizer": "lamb"}, "graphs need AdamW"),
    ("graphs", {"use": "pretrain", "device": H100, "parallel": "fsdp", "world_size": 4}, "graphs do not run under FSDP"),
    ("fp8norm", {"use": "train"}, "fp8norm is an inference precision"),
])
def test_validate_holds_every_interaction_rule(text, context, problem):
    context = dict(context)
    device, world = context.pop("device", H100), context.pop("world_size", 1)
    with pytest.raises(UserError, match=problem.replace("(", r"\(")):
        FastPlan.parse(text).validate(device, world, **context)


def test_kernel_options_name_what_is_missing(no_triton):
    with pytest.raises(UserError, match=r"gelugemm: needs triton \(pip install 'ctxkit\[gpu\]'\)"):
        resolve("graphs+gelugemm", use="infer", device=H100)
    assert supported("qkv_grad", H100, torch.bfloat16) == "needs triton (pip install 'ctxkit[gpu]')"


def test_registry_reasons(triton_installed):
    assert supported("gelu_gemm", H100, torch.bfloat16) is None
    assert supported("gelu_gemm", A100, torch.bfloat16) == "needs compute capability >= 9.0 (NVIDIA A100-SXM4-40GB is 8.0)"
    assert supported("gelu_gemm", H100, torch.float32) == "computes in float16 or bfloat16, not float32"
    assert supported("fp8_training", DeviceInfo("cuda", (8, 6), "RTX 3090"), None).startswith("needs compute capability >= 8.9")
    assert supported("master_adamw", "cpu") == "needs a CUDA GPU"
    with pytest.raises(KeyError, match="no fast kernel named"):
        supported("warp_drive", H100)


def test_cpu_tensors_take_triton_kernels_only_inside_interpret_on_cpu(triton_installed, monkeypatch):
    """TRITON_INTERPRET=1 alone (the suite sets it without a GPU) changes no answer: the
    kernel tests enter ``interpret_on_cpu``, and even there ``auto`` takes no kernel on a CPU."""
    from ctxkit.fast import dropout

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernels.clear_cache()
    interpreted = ("gelu_gemm", "fp8_gemm", "qkv_grad", "dropout_bits", "decode_layers", "master_adamw")
    assert all(supported(name, "cpu", torch.float16) == "needs a CUDA GPU" for name in interpreted)
    assert not dropout._kernel_runs("cpu")
    with kernels.interpret_on_cpu():
        assert all(supported(name, "cpu", torch.float16) is None for name in interpreted)
        assert supported("fp8_training", "cpu") == "needs a CUDA GPU"  # torchao's: no interpreter
        assert dropout._kernel_runs("cpu")  # the modules' cached answers follow
        for use in USES:
            assert str(resolve("auto", use=use, device="cpu")) == "qkv"
    assert supported("gelu_gemm", "cpu", torch.float16) == "needs a CUDA GPU" and not dropout._kernel_runs("cpu")
    monkeypatch.delenv("TRITON_INTERPRET")
    with kernels.interpret_on_cpu():  # the scope without the interpreter: nothing runs on the CPU
        assert supported("qkv_grad", "cpu", torch.float16) == "needs a CUDA GPU"


# ---------------------------------------------------------------------- auto


def test_auto_on_a_cpu_is_the_fused_projection_and_says_why_the_rest_is_off():
    for use in USES:
        plan = resolve("auto", use=use, device="cpu")
        assert str(plan) == "qkv"
        assert "graphs" in plan.describe() and "needs a CUDA GPU" in plan.describe()
    line = resolve("auto", use="pretrain", device="cpu").describe()
    assert line.startswith("fast plan: qkv (auto for pretrain on cpu); off: ") and "\n" not in line
    assert "compile: compiling takes minutes on a CPU" in line


@pytest.mark.parametrize("use", USES)
def test_auto_on_a_hopper_gpu_with_triton_is_the_measured_preset(triton_installed, use):
    assert resolve("auto", use=use, device=H100, precision="bf16") == FastPlan.parse(PRESETS[use]).for_use(use)


def test_auto_leaves_out_what_a_gpu_cannot_run_and_says_why(triton_installed):
    ampere = resolve("auto", use="pretrain", device=A100)
    assert "gelugemm" not in ampere.tokens() and "qkvpack" in ampere.tokens()
    assert "gelugemm: needs compute capability >= 9.0 (NVIDIA A100-SXM4-40GB is 8.0)" in ampere.describe()
    fp32 = resolve("auto", use="pretrain", device=H100, precision="fp32")
    assert not {"bf16res", "master", "gelugemm", "qkvpack"} & set(fp32.tokens())
    ddp = resolve("auto", use="pretrain", device=H100, world_size=2)
    assert "master" not in ddp.tokens() and "pack" not in ddp.tokens() and "master, pack: runs in one process" in ddp.describe()
    fsdp = resolve("auto", use="pretrain", device=H100, world_size=2, parallel="fsdp")
    assert "graphs" not in fsdp.tokens() and "no CUDA graphs under FSDP" in fsdp.describe()
    accum = resolve("auto", use="train", device=H100, grad_accum=4)
    assert str(accum) == "qkv" and "CUDA graphs need grad_accum 1" in accum.describe()


def test_auto_without_triton_names_the_extra(no_triton):
    plan = resolve("auto", use="infer", device=H100)
    assert str(plan) == "graphs+compile+qkv"
    assert "gelugemm: needs triton (pip install 'ctxkit[gpu]')" in plan.describe()


def test_auto_edits_apply_after_resolving_and_must_run(triton_installed):
    plan = resolve("auto-compile+ckpt", use="pretrain", device=H100)
    assert "compile" not in plan.tokens() and "normsplit64" not in plan.tokens() and "ckpt" in plan.tokens()
    assert "maskdrop" not in plan.tokens()  # it pays only in compiled graphs
    with pytest.raises(UserError, match="graphs need a CUDA GPU"):
        resolve("auto+graphs", use="train", device="cpu")


def test_resolution_from_torch_cuda_as_a_gpu_answers(monkeypatch, triton_installed):
    """No DeviceInfo passed: the registry reads torch.cuda, patched to answer as an H100."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
    plan = resolve("auto", use="infer", device="cuda")
    assert str(plan) == PRESETS["infer"] and "NVIDIA H100 80GB HBM3 (sm 9.0)" in plan.describe()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    kernels.clear_cache()
    assert "gelugemm" not in resolve("auto", use="infer", device="cuda:0").tokens()


def test_a_recorded_plan_is_a_ceiling(triton_installed):
    recorded = dataclasses.replace(FastPlan.parse("pretrain+ckpt"), lenient=True)
    on_cpu = resolve(recorded, use="infer", device="cpu")
    assert str(on_cpu) == "qkv" and "recorded plan" in on_cpu.describe()
    assert str(resolve(recorded, use="pretrain", device=H100)) == "graphs+compile+normsplit64+qkv+qkvpack+gelugemm+maskdrop+bf16res+master+pack+ckpt"
    with pytest.raises(UserError):  # the same plan asked for now must run
        resolve("pretrain+ckpt", use="infer", device="cpu")


# ---------------------------------------------------------------------- each preset computes reference's function


def _bert():
    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64, dropout=0.0, attention_dropout=0.0)
    return BertModel(config)


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


@pytest.mark.parametrize("preset", sorted(set(PRESETS) - {"reference"}))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_preset_computes_what_reference_computes(preset, dtype):
    """The preset's module swaps (compiling and graphs wrap calls, and are tested with their
    runners) give reference's outputs and, for the training presets, its gradients, each
    within the dtype's rounding of a float64 run (bf16: under autocast, the stream in bf16)."""
    ids, mask = _inputs()
    ref = _bert()
    reference = float64(ref)
    expect = reference(ids, mask).last_hidden_state
    fast = apply(copy.deepcopy(ref), preset)
    assert {type(m).__name__ for m in fast.modules()} != {type(m).__name__ for m in ref.modules()}  # something swapped
    training = preset in ("train", "pretrain")
    fast.train(training)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = fast(ids, mask).last_hidden_state
    bound = dict(depth=3, k=512, mask=mask.bool())
    assert_close_to_reference(out.float(), expect, dtype=dtype, name=f"{preset} forward", **bound)
    if training:  # a fixed random projection of the outputs (a LayerNorm output's own norm has no gradient)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * mask[..., None]
        (out.float() * weights.float()).sum().backward()
        (expect * weights).sum().backward()
        # One scale for every gradient: some are zero in exact arithmetic (the key bias under
        # softmax), and their rounding noise is set by the gradients flowing through them.
        scale = max(float(q.grad.abs().max()) for q in reference.parameters() if q.grad is not None)
        for (name, p), q in zip(fast.named_parameters(), reference.parameters()):
            if q.grad is None:  # the pooler: not on this loss's path
                assert p.grad is None, name
                continue
            assert_close_to_reference(p.grad.float(), q.grad, dtype=dtype, scale=scale, depth=4, k=512,
                                      name=f"{preset} gradient of {name}")


# ---------------------------------------------------------------------- the command line


def test_cli_fast_flag_round_trips_into_the_config_and_run_folder(tmp_path, capsys):
    from ctxkit.cli import build_parser
    from ctxkit.cli.train_flags import train_config_from_args
    from ctxkit.training import TrainConfig, Trainer

    parser = build_parser()
    for verb, required in (("finetune", ["sst-2", "--data", "d", "--out", "o"]),
                           ("pretrain", ["--data", "d", "--out", "o"]),
                           ("lm-train", ["--train", "a", "--valid", "b", "--out", "o"])):
        args = parser.parse_args([verb, *required, "--fast", "auto-compile+ckpt"])
        assert train_config_from_args(args).fast == "auto-compile+ckpt"
    old = parser.parse_args(["pretrain", "--data", "d", "--out", "o", "--compile", "--bf16-residual"])
    assert train_config_from_args(old).fast == "auto+compile+bf16res"
    assert "--fast auto+compile+bf16res" in capsys.readouterr().err
    with pytest.warns(DeprecationWarning, match="TrainConfig\\(fast='auto\\+compile-graphs'\\)"):
        assert TrainConfig(compile=True, cuda_graphs=False).fast == "auto+compile-graphs"

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, input_ids, attention_mask=None, labels=None):
            logits = self.lin(torch.nn.functional.one_hot(input_ids[:, 0] % 4, 4).float())
            return {"loss": torch.nn.functional.cross_entropy(logits, labels)}

    feats = [{"input_ids": [i % 4, 1], "labels": i % 2} for i in range(16)]
    trainer = Trainer(Toy(), feats, TrainConfig(epochs=1, batch_size=8, device="cpu", progress=False, fast="reference"), tmp_path)
    trainer.train()
    recorded = json.loads((tmp_path / "fast.json").read_text())
    assert recorded["asked"] == "reference" and recorded["resolved"] == "reference"
    start = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert start["fast"] == "reference" and start["config"]["fast"] == "reference"
    with pytest.raises(UserError, match="graphs need a CUDA GPU"):  # refused before any training
        Trainer(Toy(), feats, TrainConfig(device="cpu", progress=False, fast="graphs"), tmp_path / "no")
    assert not (tmp_path / "no" / "log.jsonl").exists()


def test_python_m_lists_the_vocabulary():
    out = subprocess.run([sys.executable, "-m", "ctxkit.fast.plan"], capture_output=True, text=True, check=True).stdout
    for option in OPTIONS:
        assert option.token in out
    assert "presets: auto, reference" in out


def test_importing_ctxkit_loads_no_compiler():
    """`import ctxkit` leaves Dynamo, Inductor and sympy unloaded (2-3 s of start-up): the
    fast paths mark and wrap their functions for torch.compile without importing it."""
    code = ("import sys, ctxkit, ctxkit.cli; "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'sympy', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_constant_result_is_dynamos_marker():
    from ctxkit.fast.kernels import _mark_constant

    def mine():
        return True

    def theirs():
        return True

    import torch._dynamo

    torch._dynamo.assume_constant_result(theirs)
    _mark_constant(mine)  # what constant_result does before Dynamo is loaded
    assert {k: v for k, v in vars(mine).items()} == {k: v for k, v in vars(theirs).items()} == {"_dynamo_marked_constant": True}


def test_predict_leaves_compile_out_of_auto_for_a_file_too_short_to_repay_it():
    """``ctxkit predict`` on a GPU: ``auto`` (given, or the run's recorded plan) loses compile
    for fewer than COMPILE_PAYS_FROM lines, with a note; an explicit plan, a long file and a
    machine where auto would not compile anyway are left as they are."""
    from ctxkit.fast.kernels import DeviceInfo
    from ctxkit.inference.backends import COMPILE_PAYS_FROM, plan_for_items

    h200 = DeviceInfo("cuda", (9, 0), "NVIDIA H200", 0)
    assert resolve("auto", use="infer", device=h200).compile != "off"
    for asked in (None, "auto"):
        plan, note = plan_for_items(FastPlan.parse("auto"), 50_000, asked, h200)
        assert str(plan) == "auto-compile" and resolve(plan, use="infer", device=h200).compile == "off"
        assert resolve(plan, use="infer", device=h200).cuda_graphs  # the rest of auto stays
        assert note.startswith("compile off for 50,000 inputs") and "--fast auto+compile" in note
    for plan, items, asked, device in ((FastPlan.parse("auto"), COMPILE_PAYS_FROM, "auto", h200),
                                       (FastPlan.parse("infer"), 50_000, "infer", h200),
                                       (FastPlan.parse("auto+compile"), 50_000, "auto+compile", h200),
                                       (FastPlan.parse("auto"), 50_000, None, "cpu")):
        assert plan_for_items(plan, items, asked, device) == (plan, None)
    assert plan_for_items(None, 10, None, h200) == (None, None)  # an exported run: no plan
