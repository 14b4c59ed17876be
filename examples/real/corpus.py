"""The correct programs: every model under every parallelism style, forward and training."""

from __future__ import annotations

import functools
from dataclasses import replace

from .catalog import Example, program
from .models import gpt2
from .models.config import GPT2
from .models.par import Par
from .programs import Variant

TP = Par(tp="tp")
TP_VOCAB = Par(tp="tp", vocab=True)
SP = Par(tp="tp", sp=True, vocab=True)
DP_TP = Par(dp="dp", tp="tp", vocab=True)
DP_TP_SP = Par(dp="dp", tp="tp", cp="sp")
DP = Par(dp="dp")
FSDP = Par(fsdp="fsdp")
CP = Par(cp="cp")
RING = Par(cp="cp", ring="unrolled")
RING_LOOP = Par(cp="cp", ring="loop")
EP = Par(ep="ep")
EP_TP = Par(ep="ep", tp="tp")

TP_MESH = {n: (("tp", n),) for n in (2, 4, 8)}
DP_TP_MESH = (("dp", 2), ("tp", 4))
DP_TP_SP_MESH = (("dp", 2), ("tp", 2), ("sp", 2))
DENSE = ("gpt2", "llama3", "qwen2")
MODELS = DENSE + ("moe",)


def _core(model: str) -> list[Example]:
    """What every model must show: forward and a training step at tp 2/4/8 and dp x tp, the
    layers alone, and the lax.scan variants."""
    ex = []
    # The layers alone (hidden states in and out, no embedding): tp 2/4/8 and dp x tp.
    for mesh, par, style in ((TP_MESH[2], TP, "tp"), (TP_MESH[4], TP, "tp"),
                             (TP_MESH[8], TP, "tp"), (DP_TP_MESH, DP_TP, "dp x tp")):
        if model == "llama3" and mesh == TP_MESH[8]:
            continue  # in _styles (one kv head per device)
        ex.append(program(model, "stack", par, mesh, style, f"{model} layers, Megatron TP"))
        if not (model == "llama3" and mesh == DP_TP_MESH):
            ex.append(program(model, "stack_sgd", par, mesh, style,
                              f"{model} layers: value_and_grad + SGD, Megatron TP"))
    for n in (2, 4, 8):
        ex.append(program(model, "fwd", TP_VOCAB, TP_MESH[n], "tp + vocab",
                          f"{model} forward, TP with vocab-parallel embedding and head"))
        ex.append(program(model, "adamw", TP_VOCAB, TP_MESH[n], "tp + vocab",
                          f"{model} value_and_grad + AdamW, TP, vocab-parallel CE"))
    ex += [
        program(model, "fwd", DP_TP, DP_TP_MESH, "dp x tp",
                f"{model} forward, batch over dp, Megatron TP over tp"),
        program(model, "adamw", DP_TP, DP_TP_MESH, "dp x tp",
                f"{model} AdamW step, gradients averaged over dp"),
        program(model, "stack", TP, TP_MESH[4], "tp", f"{model} layers by lax.scan", scan=True),
        program(model, "stack_sgd", TP, TP_MESH[4], "tp", f"{model} layers by lax.scan, SGD",
                scan=True),
        program(model, "fwd", TP_VOCAB, TP_MESH[4], "tp + vocab",
                f"{model} forward, layers by lax.scan", scan=True),
        program(model, "sgd", TP_VOCAB, TP_MESH[4], "tp + vocab",
                f"{model} SGD step, layers by lax.scan", scan=True),
    ]
    return ex


def _styles() -> list[Example]:
    from .bugs import gpt2_block_flat_mlp

    """Every other parallelism style, on the models where it matters."""
    four = TP_MESH[4]
    return [
        # Megatron TP with a replicated (not vocab-parallel) embedding and LM head.
        program("gpt2", "fwd", TP, four, "tp", "GPT-2 forward, replicated embedding/head"),
        # Vocab-parallel cross-entropy alone (tokens -> loss).
        program("gpt2", "loss", TP_VOCAB, four, "tp + vocab",
                "GPT-2 loss: vocab-parallel embedding and cross-entropy"),
        # Megatron sequence parallelism.
        program("gpt2", "stack", SP, four, "sp", "GPT-2 layers, Megatron sequence parallel"),
        program("llama3", "stack", SP, four, "sp", "Llama-3 layers, Megatron SP"),
        program("llama3", "stack_sgd", SP, four, "sp",
                "Llama-3 layers, SP: norm gradients psum'd over tp"),
        program("gpt2", "fwd", SP, four, "sp", "GPT-2 forward, SP + vocab-parallel embedding"),
        program("gpt2", "adamw", SP, four, "sp", "GPT-2 AdamW step under SP"),
        # Data parallel, FSDP.
        program("gpt2", "stack_sgd", DP, (("dp", 4),), "dp", "GPT-2 layers, DP, pmean grads"),
        program("gpt2", "sgd", DP, (("dp", 4),), "dp", "GPT-2 SGD step, pure DP"),
        program("llama3", "stack_sgd", FSDP, (("fsdp", 4),), "fsdp",
                "Llama-3 layers, FSDP: all_gather weights, reduce_scatter grads"),
        program("llama3", "adamw", FSDP, (("fsdp", 4),), "fsdp", "Llama-3 AdamW step, FSDP"),
        # Context parallel (sequence split, K/V all-gathered) and ring attention.
        program("llama3", "stack", CP, (("cp", 4),), "cp", "Llama-3 layers, context parallel"),
        program("llama3", "stack_sgd", CP, (("cp", 4),), "cp", "Llama-3 layers, CP, SGD"),
        program("llama3", "stack", RING, (("cp", 4),), "cp ring",
                "Llama-3 layers, ring attention (unrolled collective_permute)", suffix="_ring"),
        program("llama3", "stack", RING_LOOP, (("cp", 4),), "cp ring",
                "Llama-3 layers, ring attention in a fori_loop", suffix="_ringloop"),
        program("gpt2", "stack_sgd", RING, (("cp", 4),), "cp ring",
                "GPT-2 layers, ring attention, SGD", suffix="_ring"),
        program("llama3", "stack_sgd", RING, (("cp", 4),), "cp ring",
                "Llama-3 layers, ring attention, SGD (GQA)", suffix="_ring"),
        program("gpt2", "stack_sgd", RING_LOOP, (("cp", 4),), "cp ring",
                "GPT-2 layers, ring attention in a fori_loop, SGD", suffix="_ringloop"),
        # dp x tp x sp (3-D mesh: batch over dp, heads over tp, sequence over sp).
        program("gpt2", "stack", DP_TP_SP, DP_TP_SP_MESH, "dp x tp x sp",
                "GPT-2 layers on a 3-D mesh"),
        program("llama3", "stack_sgd", DP_TP_SP, DP_TP_SP_MESH, "dp x tp x sp",
                "Llama-3 layers on a 3-D mesh, SGD"),
        program("llama3", "fwd", DP_TP_SP, DP_TP_SP_MESH, "dp x tp x sp",
                "Llama-3 forward on a 3-D mesh"),
        # Expert parallel.
        program("moe", "stack", EP, (("ep", 4),), "ep", "MoE layers, experts over ep"),
        program("moe", "stack_sgd", EP, (("ep", 4),), "ep", "MoE layers over ep, SGD"),
        program("moe", "adamw", EP, (("ep", 4),), "ep", "MoE AdamW step over ep"),
        program("moe", "stack_sgd", EP_TP, (("ep", 2), ("tp", 2)), "ep x tp",
                "MoE layers, experts over ep, expert FFN and attention over tp"),
        program("moe", "stack_sgd", SP, four, "sp", "MoE layers, Megatron SP, router psum'd"),
        # QK-norm variants.
        program("llama3qkn", "stack", TP, four, "tp", "OLMo-2 style QK-norm under TP"),
        program("qwen3", "stack_sgd", TP, four, "tp",
                "Qwen3 per-head QK-norm: shared weight grad psum'd over tp"),
        # jax-native gradients (check_vma=True: jax inserts the psums itself).
        program("gpt2", "stack_sgd", TP.with_(megatron=False), four, "tp (jax-native)",
                "GPT-2 layers, TP, gradients by jax's vma transposes"),
        program("llama3", "sgd", DP_TP.with_(megatron=False), DP_TP_MESH, "dp x tp (jax-native)",
                "Llama-3 SGD step on dp x tp, jax-native gradients"),
        # Gradient clipping by global norm.
        program("gpt2", "stack_sgd", TP, four, "tp", "GPT-2 layers, clipped gradients",
                clip=True),
        program("llama3", "stack_sgd", TP, four, "tp", "Llama-3 layers, clipped gradients",
                clip=True),
        # Twins of the buggy programs.
        program("llama3", "stack_sgd", DP_TP, DP_TP_MESH, "dp x tp",
                "Llama-3 layers, dp x tp, gradients averaged over dp"),
        program("llama3", "stack", TP, TP_MESH[8], "tp", "Llama-3 layers at tp=8"),
        program("llama3", "stack_sgd", Par(dp="dp", megatron=False), (("dp", 4),),
                "dp (jax-native)", "Llama-3 layers, DP, loss pmean'd inside value_and_grad"),
        program("gpt2", "stack", SP, four, "sp", "GPT-2 layers under SP, MLP on flat tokens",
                suffix="_flatmlp", mod=Variant(gpt2, stack=functools.partial(
                    gpt2.stack, block_fn=gpt2_block_flat_mlp))),
        # One sequence per device (per-device micro-batch 1) and one kv head per device.
        program("gpt2", "stack_sgd", DP, (("dp", 4),), "dp", "GPT-2 layers, DP, batch 1/device",
                cfg=replace(GPT2, batch=4), suffix="_b1"),
        program("llama3", "stack_sgd", TP, TP_MESH[8], "tp",
                "Llama-3 layers at tp=8: one kv head per device"),
    ]


def correct_programs() -> list[Example]:
    ex: list[Example] = []
    for model in MODELS:
        ex += _core(model)
    ex += _styles()
    from .accum import accum_programs
    from .ce import ce_programs
    from .tricky import tricky_programs

    ex += [e for e in ce_programs()[0] if not e.tricky] + accum_programs()[0]
    return ex + tricky_programs()
