"""Where a GRPO run on a real model goes non-finite, and which lever makes it: several seeds of one recipe at once on
one GPU, each step's numbers recorded, and at a run's first non-finite step the same micro-batch replayed on the
same (still healthy) weights with the levers switched off one by one.

    python3 benchmarks/stability.py --model /tmp/qwen2.5-coder-0.5b-instruct --seeds 1,2,3 --budget-s 540 \\
      --out $OUT/stability.json [--set key=value ...]

Each seed runs `grpo rl -c countdown` as issue-style users run it on a 0.5B model (`RECIPE_OVERRIDES`, then the
`--set` keys), through `run_rl`, the command's own path, in a process of its own. Per optimizer step it records the
loss, gradient norm, reward, and from the policy's forward the lowest token log-probability, the largest
reference-minus-policy log-probability (the KL estimate's exponent), and whether either was non-finite. At the first
step whose gradients are not finite it records which parameters' gradients are, then recomputes the micro-batch's
loss and backward as it ran, without activation offloading, with TRL's own LM-head backward, and with both off.
The guard (on by default) skips the step; the run goes on until its steps or the time budget end.

`--plain` runs each seed as the command itself (`python3 -m grpo_cli rl -c countdown ...`) with none of the per-step
records: the steps and non-finite steps come from its console and `train_summary.json`. Only at a step whose
gradients the guard finds non-finite (the first three of a run) does something more run: the same micro-batch is
replayed on the same weights, twice as the run has the levers and then with each lever off (`replay_variants`), and
the gradient norm and the non-finite gradients of each replay go to the run's record (`run-N.jsonl`, `replays` in the
JSON). A non-finite value that comes back in the replay as run is a property of the weights and the batch; one that
does not came from the run's timing or memory layout.

Each run has `stall_timeout` set to `--stall-s`: when no step ends for that long, the command itself writes every
thread's Python stack into `run-N/stall-stacks.txt`. A run whose log stops growing for that long is stalled: it is
sent SIGUSR1 (its stacks once more, into `run-N.stall.txt`) and records its state, the kernel wait channel of each
thread and both sets of stacks. Once every live run has stalled the budget ends early.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

RECIPE_OVERRIDES = {
    "dataset_generate": "4000",
    "dataset_test_size": "200",
    "swanlab": "false",
    "per_device_train_batch_size": "64",
    "learning_rate": "1e-6",
    "max_completion_length": "512",
    "max_steps": "300",
    "save_steps": "100000",
    "sample_every": "0",
}


def overrides_of(pairs: list[str], stall_s: float | None = None) -> dict[str, str]:
    """RECIPE_OVERRIDES (and `stall_timeout`, when given) with `key=value` pairs on top."""
    stall = {} if stall_s is None else {"stall_timeout": f"{stall_s:g}"}
    return {**RECIPE_OVERRIDES, **stall, **dict(pair.split("=", 1) for pair in pairs)}


def finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def replay_batch(
    trainer, model, inputs, loss_of, offloads: list, trl_head, lean: bool, offloading: bool, **switches
) -> dict:
    """A micro-batch's loss and gradients again on the current weights, with the levers as given: `offloads` are the
    run's `LayerInputOffload` objects (their hooks come off without offloading), `trl_head` TRL's own LM-head
    function (run instead of the lean one without `lean`); `switches` as `AttentionProbe` takes them (`attention`,
    `rope`), and `probe` to record where in the attention a non-finite gradient arises. Leaves no gradients behind."""
    import torch

    from grpo_cli import trl_private
    from grpo_cli.train import health

    if not offloading:
        for o in offloads:
            o.remove()
    previous = trl_private.chunked_logprob()
    if not lean:
        trl_private.use_chunked_logprob(trl_head)
    probe = AttentionProbe(
        model, switches.get("attention"), switches.get("rope", "as run"), switches.get("probe"), switches.get("save")
    )
    try:
        model.zero_grad(set_to_none=True)
        with probe, trainer.compute_loss_context_manager():
            probe.recording = True
            loss = loss_of(model, inputs)
            probe.recording = False
            trainer.accelerator.backward(loss)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else None
        flags = health.gradient_flags(model)
        found = {
            "loss": finite_or_none(float(loss.detach())),
            "grad_norm": finite_or_none(norm),
            "gradients": health.nonfinite_gradients(flags),
        }
        if found["gradients"] and flags is not None:  # the few finite ones say where in the top layer it arose
            names, finite = flags
            kept = [name for name, ok in zip(names, finite.tolist()) if ok]
            found["finite_gradients"] = kept if len(kept) <= 32 else len(kept)
        if probe.probing:
            found["attention"] = probe.findings()
        return found
    finally:
        probe.calls.clear()
        trl_private.use_chunked_logprob(previous)
        if not offloading:
            for o in offloads:  # the hooks back on, as the run had them
                o.__init__(model, o.min_bytes)
        model.zero_grad(set_to_none=True)


def _rotate_half(x):
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Rotary embeddings in plain torch (the textbook rotation), for a replay without liger-kernel's rotary kernel."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


ATTENTION_BACKENDS = ("math", "efficient", "cudnn")


class AttentionProbe:
    """For one replay: how `torch.nn.functional.scaled_dot_product_attention` runs (`attention`: None as the run
    chose, a backend of `ATTENTION_BACKENDS`, "float32": query, key and value upcast, or "eager": transformers'
    attention without SDPA), how the rotary embedding runs (`rope`: "as run", or "reference": `reference_rope` in
    the model's module instead of what liger-kernel put there), and with `probe` every call of the forward pass kept with hooks on its query, key, value and output
    gradients, to find the call where a non-finite gradient first arises in the backward pass (the highest layer
    whose input gradients are not finite while its output gradient is) and re-run that call alone on each backend.
    `save`: a path for that call's tensors (the sequences with non-finite values), to reproduce it elsewhere."""

    def __init__(self, model, attention=None, rope="as run", probe=False, save=None):
        self.model, self.attention, self.rope, self.probing, self.save = model, attention, rope, bool(probe), save
        self.calls: list[dict] = []
        self.recording = False
        self._restore: list = []

    def __enter__(self):
        import torch.nn.functional as F

        self._restore.append((F, "scaled_dot_product_attention", F.scaled_dot_product_attention))
        self.original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self.sdpa
        if self.attention == "eager":  # transformers' own attention (float32 softmax), read at every forward
            config = unwrapped(self.model).config
            self._restore.append((config, "_attn_implementation", config._attn_implementation))
            config._attn_implementation = "eager"
        if self.rope == "reference":
            module = sys.modules[type(unwrapped(self.model)).__module__]
            self._restore.append((module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb))
            module.apply_rotary_pos_emb = reference_rope
        return self

    def __exit__(self, *exc):
        while self._restore:
            owner, name, value = self._restore.pop()
            setattr(owner, name, value)

    def run(self, how, query, key, value, attn_mask=None, **kwargs):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if how == "float32":
            return self.original(query.float(), key.float(), value.float(), attn_mask, **kwargs).to(query.dtype)
        if how in ATTENTION_BACKENDS:
            backend = {
                "math": SDPBackend.MATH,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION,
            }[how]
            with sdpa_kernel([backend]):
                return self.original(query, key, value, attn_mask, **kwargs)
        return self.original(query, key, value, attn_mask, **kwargs)

    def sdpa(self, query, key, value, attn_mask=None, **kwargs):
        out = self.run(self.attention, query, key, value, attn_mask, **kwargs)
        if self.probing and self.recording and query.requires_grad:
            call = {"inputs": (query.detach(), key.detach(), value.detach(), attn_mask, kwargs), "grads": {}}
            self.calls.append(call)
            for name, tensor in (("query", query), ("key", key), ("value", value), ("output", out)):
                if tensor.requires_grad:
                    tensor.register_hook(lambda grad, name=name, call=call: self.keep(call, name, grad))
        return out

    @staticmethod
    def keep(call: dict, name: str, grad) -> None:
        """A gradient as it reaches the call, copied: the next backward function may work in it in place (liger's
        rotary kernel does, where the layout lets it)."""
        call["grads"][name] = grad.detach().clone()

    def findings(self) -> dict:
        """Per call (layer order): which gradients were finite; at the call where a non-finite one arose, where it
        is, what the mask lets those query rows see, and what each backend gives on that call alone."""
        import torch

        flags = [{name: bool(torch.isfinite(g).all()) for name, g in call["grads"].items()} for call in self.calls]
        origin = next(
            (
                i
                for i in reversed(range(len(self.calls)))
                if flags[i].get("output", True) and not all(ok for name, ok in flags[i].items() if name != "output")
            ),
            None,
        )
        found: dict = {
            "calls": len(self.calls),
            "non_finite_input_gradients_at": [
                i for i, f in enumerate(flags) if not all(ok for n, ok in f.items() if n != "output")
            ],
            "non_finite_output_gradients_at": [i for i, f in enumerate(flags) if not f.get("output", True)],
            "origin": origin,
        }
        if origin is None:
            return found  # the attention's gradients were finite where the others were not: it arose outside it
        call = self.calls[origin]
        query, key, value, mask, kwargs = call["inputs"]
        found["origin_flags"] = flags[origin]
        found["shapes"] = {
            "query": list(query.shape),
            "key": list(key.shape),
            "mask": None if mask is None else [list(mask.shape), str(mask.dtype)],
            "kwargs": {k: str(v) for k, v in kwargs.items()},
        }
        bad = {name: ~torch.isfinite(g) for name, g in call["grads"].items() if name != "output"}
        rows = sorted({int(b) for m in bad.values() for b in m.nonzero()[:, 0].unique().tolist()})
        found["sequences"] = rows[:16]
        found["non_finite_elements"] = {name: int(m.sum()) for name, m in bad.items()}
        def visible(line) -> int:  # the entries of a mask's row or column that let attention through
            if line.dtype == torch.bool:
                return int(line.sum())
            return int((line > torch.finfo(line.dtype).min / 2).sum())

        def mask_of(b: int, h: int):
            return mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0]

        scale = kwargs.get("scale") or query.shape[-1] ** -0.5
        for name, where in bad.items():
            if not where.any():
                continue
            at = where.any(dim=-1).nonzero()[:8].tolist()  # (sequence, head, position) of its first bad rows
            found[f"{name}_rows"] = at
            b, h, t = at[0]
            if name == "query":  # the keys those query positions may see, and the first one's scores
                if mask is not None:
                    found["keys_visible_to_those_rows"] = [visible(mask_of(b_, h_)[t_]) for b_, h_, t_ in at]
                scores = (query[b, h, t].float() @ key[b, h].float().T) * scale
            else:  # the queries that may see those key positions, and the scores of the first one's column
                if mask is not None:
                    found["queries_seeing_those_positions"] = [visible(mask_of(b_, h_)[:, t_]) for b_, h_, t_ in at]
                scores = (query[b, h].float() @ key[b, h, t].float()) * scale
            found[f"first_{name}_row_scores"] = {"max": float(scores.max()), "min": float(scores.min())}
        if "output" in call["grads"]:
            found["output_gradient_abs_max"] = float(call["grads"]["output"].abs().max())
        pick = rows[:1]
        if pick:
            found["alone"] = self.alone(query, key, value, mask, kwargs, call["grads"].get("output"), pick)
        return found

    def alone(self, query, key, value, mask, kwargs, grad_out, rows: list[int]) -> dict:
        """The origin call's sequences `rows` through SDPA alone, as run and on each backend (and in float32):
        which of the query, key and value gradients come out non-finite. Saved to `self.save` when set."""
        import torch

        index = torch.tensor(rows, device=query.device)
        part = [t.index_select(0, index) for t in (query, key, value)]
        part_mask = mask.index_select(0, index) if mask is not None and mask.shape[0] > 1 else mask
        part_grad = grad_out.index_select(0, index) if grad_out is not None else torch.ones_like(part[0])
        if self.save:
            tensors = dict(zip(("query", "key", "value"), (t.cpu() for t in part)))
            tensors["mask"] = None if part_mask is None else part_mask.cpu()
            torch.save({**tensors, "grad_output": part_grad.cpu(), "kwargs": kwargs, "sequences": rows}, self.save)
        results = {}
        for how in (self.attention, *ATTENTION_BACKENDS, "float32"):
            leaves = [t.clone().requires_grad_(True) for t in part]
            try:
                out = self.run(how, *leaves, part_mask, **kwargs)
                out.backward(part_grad.to(out.dtype))
                results[how or "as run"] = {
                    "output_finite": bool(torch.isfinite(out).all()),
                    **{n: bool(torch.isfinite(t.grad).all()) for n, t in zip(("query", "key", "value"), leaves)},
                }
            except Exception as err:  # noqa: BLE001 - a backend that refuses these inputs is a finding too
                results[how or "as run"] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
        return results


def unwrapped(model):
    """The model under a PEFT or DDP wrapper: the class whose module holds its rotary function."""
    while hasattr(model, "module"):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def replay_all(trainer, model, inputs, loss_of, offloads: list, trl_head, save: Path | None) -> dict:
    """Every replay of `replay_variants` of one micro-batch: name -> what it gave (or the error it raised). The
    probed replay saves its attention call's tensors to `save` when given."""
    from grpo_cli import trl_private

    lean = trl_private.chunked_logprob() is not trl_head
    replays = {}
    for name, settings in replay_variants(lean, bool(offloads)):
        if settings.get("probe") and save is not None:
            settings = {**settings, "save": str(save)}
        try:
            replays[name] = replay_batch(trainer, model, inputs, loss_of, offloads, trl_head, **settings)
        except Exception as err:  # noqa: BLE001 - a failed replay is a finding too
            replays[name] = {"error": f"{type(err).__name__}: {err}"}
    return replays


def replay_variants(lean: bool, offloading: bool) -> list[tuple[str, dict]]:
    """(name, settings) of each replay (`replay_batch`'s levers): first as the run has them, probing where in the
    attention the non-finite gradient arises, then again (a non-finite value that comes back is a property of the
    weights and the batch; one that does not came from the run's timing or memory), then the attention on other
    terms: each SDPA backend, in float32, and the rotary embedding in plain torch."""
    run = {"lean": lean, "offloading": offloading}
    return [
        ("as run, probed", {**run, "probe": True}),
        ("as run, again", run),
        *((f"attention {how}", {**run, "attention": how}) for how in (*ATTENTION_BACKENDS, "float32", "eager")),
        ("reference rotary", {**run, "rope": "reference"}),
    ]


def recorded_offloads(rl_module) -> list:
    """Make `grpo rl` (`rl_module`) build its `LayerInputOffload` as one that records itself: the list of those
    built, each once (a replay without offloading calls `__init__` again on one to put its hooks back)."""
    offloads: list = []

    class Offload(rl_module.LayerInputOffload):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            if self not in offloads:
                offloads.append(self)

    rl_module.LayerInputOffload = Offload
    return offloads


def child(args) -> None:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    import grpo_cli.train.rl as rl_module
    from grpo_cli import trl_private
    from grpo_cli.recipe import load_recipe
    from grpo_cli.train import run
    from grpo_cli.train.rl import run_rl

    record = Path(args.record)
    stacks_on_sigusr1(record.with_suffix(".stall.txt"))
    trl_head = trl_private.chunked_logprob()
    offloads = recorded_offloads(rl_module)
    seen: dict = {}

    logps_of = GRPOTrainer._get_per_token_logps_and_entropies
    compute_loss = GRPOTrainer._compute_loss

    def logps_and_entropies(self, model, *a, **k):
        logps, entropies, aux = logps_of(self, model, *a, **k)
        if torch.is_grad_enabled():
            seen["logps"] = logps.detach()
        return logps, entropies, aux

    def loss_of(self, model, inputs):
        seen["inputs"] = inputs
        loss = compute_loss(self, model, inputs)
        mask = inputs["completion_mask"].bool()
        logps = seen["logps"]
        stats = {"loss": float(loss.detach()), "logps_finite": bool(torch.isfinite(logps[mask]).all())}
        stats["min_logp"] = float(logps[mask].min()) if mask.any() else None
        if inputs.get("ref_per_token_logps") is not None:
            gap = (inputs["ref_per_token_logps"] - logps)[mask]
            stats["max_ref_minus_logp"] = float(gap.max()) if mask.any() else None
        seen.setdefault("micro", []).append(stats)
        return loss

    GRPOTrainer._get_per_token_logps_and_entropies = logps_and_entropies
    GRPOTrainer._compute_loss = loss_of

    class Diagnose(TrainerCallback):
        trainer = None
        diagnosed = None  # what the first micro-batch with non-finite gradients showed

        def after_backward(self, trainer, model) -> None:
            """Before clipping spreads a NaN norm to every gradient: which ones are not finite, and the replays."""
            if self.diagnosed is not None:
                return
            grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
            bad = [n for n, g in grads if not bool(torch.isfinite(g).all())]
            if not bad:
                return
            found = {"bad_grads": {"count": len(bad), "of": len(grads), "first": bad[:8], "last": bad[-4:]}}
            with open(record, "a") as out:  # before the replays, so a replay that never returns still shows
                out.write(json.dumps({"diagnosing": trainer.state.global_step + 1, **found}) + "\n")
            found["replays"] = replay_all(
                trainer, model, seen["inputs"], lambda m, i: compute_loss(trainer, m, i), offloads, trl_head,
                record.with_suffix(".attention.pt"),
            )
            trainer.step_guard.note(
                "gradient norm"
            )  # the replays left their own gradients: skip the step anyway
            for p in model.parameters():
                p.grad = None
            self.diagnosed = found
            seen["diagnosis"] = found

        def on_pre_optimizer_step(self, args_, state, control, model=None, **kwargs):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = float(torch.nn.utils.get_total_norm(grads)) if grads else None
            entry = {"step": state.global_step + 1, "grad_norm": norm, "micro": seen.pop("micro", [])}
            entry.update(seen.pop("diagnosis", {}))
            with open(record, "a") as out:
                out.write(json.dumps(entry) + "\n")

        def on_log(self, args_, state, control, logs=None, **kwargs):
            keep = (
                "reward",
                "reward_std",
                "kl",
                "entropy",
                "completions/clipped_ratio",
                "completions/mean_length",
                "grad_norm",
                "loss",
                "frac_reward_zero_std",
                "step_time",
            )
            with open(record, "a") as out:
                out.write(json.dumps({"log": state.global_step, **{k: logs.get(k) for k in keep}}) + "\n")

    diagnose = Diagnose()
    training_step = GRPOTrainer.training_step

    def step_then_diagnose(self, model, *a, **k):
        loss = training_step(self, model, *a, **k)
        diagnose.after_backward(self, model)
        return loss

    GRPOTrainer.training_step = step_then_diagnose
    callbacks = run.TrainingRun.callbacks
    train = run.TrainingRun.train

    def with_diagnosis(self):
        found = callbacks(self)
        return found[:-1] + [diagnose, found[-1]] if self.guard else found + [diagnose]

    def train_with(self, trainer):
        diagnose.trainer = trainer
        return train(self, trainer)

    run.TrainingRun.callbacks = with_diagnosis
    run.TrainingRun.train = train_with
    keys = {"model_name_or_path": args.model, "seed": str(args.seed), "output_dir": args.work}
    overrides = [
        token for key, value in {**keys, **overrides_of(args.set, args.stall_s)}.items() for token in (f"--{key}", value)
    ]
    started = time.time()
    try:
        run_rl(load_recipe("countdown", overrides, "rl"), resume=False, overwrite=True)
        status = "finished"
    except Exception as err:  # noqa: BLE001 - the guard's stop is a result
        status = f"{type(err).__name__}: {err}"
    with open(record, "a") as out:
        out.write(json.dumps({"status": status, "seconds": round(time.time() - started, 1)}) + "\n")


STALL_FILE_ENV = "STABILITY_STALL_FILE"
REPLAY_FILE_ENV = "STABILITY_REPLAY_FILE"
REPLAYS_PER_RUN = 3  # bad steps replayed per run (a replay takes about what a step's forward/backward takes)
# Loaded through PYTHONPATH in a --plain run: every thread's stack on SIGUSR1, and the replays of bad steps.
_SITECUSTOMIZE = f"""import faulthandler, os, signal, sys
faulthandler.register(signal.SIGUSR1, file=open(os.environ["{STALL_FILE_ENV}"], "a"), all_threads=True)
if os.environ.get("{REPLAY_FILE_ENV}"):
    sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
    import stability
    stability.replay_bad_steps(os.environ["{REPLAY_FILE_ENV}"])
"""


def replay_bad_steps(record: str) -> None:
    """In a --plain run: once `grpo_cli.train.rl` is imported (at once if it is), make the step guard replay the first
    `REPLAYS_PER_RUN` steps whose gradients it finds non-finite (`replay_variants`, on the same weights and
    micro-batch, before the next step) and append what each replay gave to `record`, one JSON line per step.

    A healthy step is as the command runs it: no host read, no copy; the micro-batch's inputs are kept by reference
    until the next micro-batch's loss (with one micro-batch per step, as in `RECIPE_OVERRIDES`, that is the step's
    whole batch)."""
    import importlib.abc
    import importlib.util

    def patch(rl_module) -> None:
        from trl import GRPOTrainer

        from grpo_cli import trl_private
        from grpo_cli.train import health

        offloads = recorded_offloads(rl_module)
        seen: dict = {}
        trl_head = trl_private.chunked_logprob()
        compute_loss = GRPOTrainer.compute_loss

        def keeping_inputs(self, model, inputs, *a, **k):
            seen["inputs"] = inputs
            return compute_loss(self, model, inputs, *a, **k)

        GRPOTrainer.compute_loss = keeping_inputs
        on_pre_optimizer_step = health.StepGuard.on_pre_optimizer_step

        def then_replay(self, args, state, control, model=None, **kwargs):
            result = on_pre_optimizer_step(self, args, state, control, model=model, **kwargs)
            bad = self._this_step
            if bad is None or "gradient norm" not in bad.what or seen.get("replayed", 0) >= REPLAYS_PER_RUN:
                return result
            seen["replayed"] = seen.get("replayed", 0) + 1
            trainer = self.trainer
            found = {"replaying": bad.step, "gradients": bad.gradients}
            with open(record, "a") as out:  # before the replays, so a replay that never returns still shows
                out.write(json.dumps(found) + "\n")
            save = Path(record).with_suffix(".attention.pt")
            replays = replay_all(
                trainer, trainer.model_wrapped, seen["inputs"], lambda m, i: compute_loss(trainer, m, i), offloads,
                trl_head, None if save.exists() else save,
            )
            with open(record, "a") as out:
                out.write(json.dumps({"step": bad.step, "gradients": bad.gradients, "replays": replays}) + "\n")
            return result

        health.StepGuard.on_pre_optimizer_step = then_replay

    class AfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "grpo_cli.train.rl":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run_module = spec.loader.exec_module

            def run_then_patch(module):
                run_module(module)
                patch(module)

            spec.loader.exec_module = run_then_patch
            return spec

    if "grpo_cli.train.rl" in sys.modules:
        patch(sys.modules["grpo_cli.train.rl"])
    else:
        sys.meta_path.insert(0, AfterImport())


def stacks_on_sigusr1(path: Path) -> None:
    """faulthandler writes every thread's stack to `path` on SIGUSR1 (its own C code: whatever the stuck thread
    holds)."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=open(path, "a"), all_threads=True)  # noqa: SIM115 - for life


def process_state(pid: int) -> dict:
    """What the kernel says a process is doing: its state and the wait channels of its threads (how many each)."""
    proc = Path(f"/proc/{pid}")
    state = {}
    try:
        status = (proc / "status").read_text()
        state["state"] = next(
            (line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("State")), None
        )
        channels: dict[str, int] = {}
        for task in (proc / "task").iterdir():
            channel = (task / "wchan").read_text().strip() or "-"
            channels[channel] = channels.get(channel, 0) + 1
        state["thread_wait_channels"] = channels
    except OSError as err:
        state["error"] = str(err)
    return state


STEP_LINE = re.compile(r"^step\s+(\d+)/\d+", re.MULTILINE)


def plain_command(args, seed: int, run_dir: Path) -> list[str]:
    keys = {"model_name_or_path": args.model, "seed": str(seed), "output_dir": str(run_dir)}
    flags = [
        token for key, value in {**keys, **overrides_of(args.set, args.stall_s)}.items() for token in (f"--{key}", value)
    ]
    return [sys.executable, "-m", "grpo_cli", "rl", "-c", "countdown", *flags, "--no-resume", "--overwrite"]


def plain_result(run_dir: Path, log_text: str) -> dict:
    """Steps and non-finite steps of a --plain run, from its train_summary.json or else its console."""
    summary_path = run_dir / "train_summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        non_finite = [entry["step"] for entry in summary.get("non_finite_steps", [])]
        return {
            "steps_done": summary.get("global_step"),
            "non_finite_steps": non_finite,
            # which gradients were non-finite before clipping, where the guard could tell
            "non_finite_gradients": {
                str(entry["step"]): entry["gradients"]
                for entry in summary.get("non_finite_steps", [])
                if "gradients" in entry
            },
            "status": "finished",
            "stopped": summary.get("stopped"),
            "logs": summary.get("log_history", []),
        }
    steps = [int(n) for n in STEP_LINE.findall(log_text)]
    non_finite = sorted({int(n) for n in re.findall(r"step (\d+): non-finite", log_text)})
    return {
        "steps_done": max(steps, default=0),
        "non_finite_steps": non_finite,
        "status": "killed at the time budget",
    }


def patched_result(record: Path) -> dict:
    lines = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    steps = [e for e in lines if "step" in e]
    first_bad = next((e for e in lines if e.get("bad_grads")), None)
    non_finite = [e["step"] for e in steps if finite_or_none(e["grad_norm"]) is None or e.get("bad_grads")]
    return {
        "steps_done": len(steps),
        "non_finite_steps": non_finite,
        "first_non_finite": first_bad,
        "status": next((e["status"] for e in lines if "status" in e), "killed at the time budget"),
        "steps": steps,
        "logs": [e for e in lines if "log" in e],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument(
        "--stall-s", type=float, default=240, help="a run whose log stays this long unchanged is stalled"
    )
    parser.add_argument(
        "--plain", action="store_true", help="run `grpo rl` itself, without the per-step records"
    )
    parser.add_argument("--out", help="the JSON written (required unless --child)")
    parser.add_argument("--work", default="/tmp/stability")
    parser.add_argument(
        "--set", nargs="*", default=[], help="recipe overrides on top of RECIPE_OVERRIDES: key=value"
    )
    parser.add_argument("--label", default="default")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--record")
    args = parser.parse_args()
    if args.child:
        return child(args)

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    procs = {}
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        run_dir = work / f"run-{i}"  # one folder, record and log per process, a seed repeated or not
        record, log_path, stall_path = (
            run_dir.with_suffix(suffix) for suffix in (".jsonl", ".log", ".stall.txt")
        )
        for path in (record, stall_path):
            path.unlink(missing_ok=True)
        env = dict(os.environ)
        if args.plain:
            command = plain_command(args, seed, run_dir)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
            env[STALL_FILE_ENV] = str(stall_path)
            env[REPLAY_FILE_ENV] = str(record)
        else:
            command = [
                sys.executable,
                __file__,
                "--child",
                "--model",
                args.model,
                "--seed",
                str(seed),
                "--record",
                str(record),
                "--work",
                str(run_dir),
                "--stall-s",
                str(args.stall_s),
                "--set",
                *args.set,
            ]
        with open(log_path, "w") as log:  # the child holds its own copy of the file
            child_process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        procs[i] = {
            "seed": seed,
            "process": child_process,
            "record": record,
            "log": log_path,
            "stall": stall_path,
            "run_dir": run_dir,
            "stalled": None,
        }
    started = time.time()
    deadline = started + args.budget_s
    while time.time() < deadline:
        live = [entry for entry in procs.values() if entry["process"].poll() is None]
        if not live:
            break
        for entry in live:
            quiet_s = time.time() - entry["log"].stat().st_mtime
            if entry["stalled"] is None and quiet_s > args.stall_s:
                entry["process"].send_signal(signal.SIGUSR1)  # the stacks now, beside the watchdog's
                entry["stalled"] = {
                    "after_s": round(time.time() - started),
                    "quiet_s": round(quiet_s),
                    **process_state(entry["process"].pid),
                }
                print(f"run of seed {entry['seed']} stalled: {entry['stalled']}", flush=True)
        if all(entry["stalled"] for entry in live):
            time.sleep(2)  # for the SIGUSR1 dumps
            break
        time.sleep(5)
    for entry in procs.values():
        if entry["process"].poll() is None:
            os.killpg(entry["process"].pid, signal.SIGKILL)
    runs = []
    for entry in procs.values():
        log_text = entry["log"].read_text(errors="replace")
        found = plain_result(entry["run_dir"], log_text) if args.plain else patched_result(entry["record"])
        if args.plain and entry["record"].exists():
            found["replays"] = [json.loads(line) for line in entry["record"].read_text().splitlines()]
        if entry["stalled"]:
            found["status"] = "stalled"
            for key, path in (("stacks", entry["run_dir"] / "stall-stacks.txt"), ("sigusr1_stacks", entry["stall"])):
                entry["stalled"][key] = path.read_text(errors="replace")[-12000:] if path.exists() else None
        runs.append(
            {
                "seed": entry["seed"],
                "label": args.label,
                "plain": args.plain,
                "overrides": overrides_of(args.set, args.stall_s),
                **found,
                "stalled": entry["stalled"],
                "exit_code": entry["process"].poll(),
            }
        )
    from grpo_cli.atomic import json_text

    Path(args.out).write_text(json_text({"label": args.label, "runs": runs}, indent=1))  # NaN and inf as null
    for run_ in runs:
        print(
            f"seed {run_['seed']}: {run_['steps_done']} steps, non-finite at {run_['non_finite_steps'][:10]}, "
            f"{str(run_['status'])[:300]}"
        )
        for replayed in run_.get("replays", []):
            print(json.dumps(replayed))
        if run_.get("first_non_finite"):
            print(json.dumps({k: v for k, v in run_["first_non_finite"].items() if k != "micro"}, indent=1))
        if run_["stalled"]:
            print(
                f"  stalled: state {run_['stalled'].get('state')}, waits {run_['stalled'].get('thread_wait_channels')}"
            )
            print("  " + "\n  ".join((run_["stalled"].get("stacks") or "").splitlines()[:40]))


if __name__ == "__main__":
    main()
