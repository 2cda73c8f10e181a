"""Real training on CPU: a tiny random Llama with the real SmolLM2 tokenizer, a few GRPO and SFT steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from conftest import mounted_tmpfs, save_model_of_another_shape

from grpo_cli.errors import UserError
from grpo_cli.launch import LAUNCHER_VARIABLES
from grpo_cli.recipe import load_recipe
from grpo_cli.recipe.hardware import Hardware, detect_hardware
from grpo_cli.report import read_run
from grpo_cli.train.checkpoints import SECOND_SIGNAL_AFTER_S

pytestmark = pytest.mark.slow


USER_REWARD = """
def vowel_share(completions, **kwargs):
    # Varies between random completions, so GRPO has advantages to learn from.
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]
"""


def tiny_run_keys(model: Path, output_dir: Path, max_steps: int = 2, save_steps: int = 1, batch: int = 4) -> str:
    """The recipe keys every tiny training run of the tests shares: the tiny model, 24 generated Countdown rows."""
    return textwrap.dedent(f"""
        model_name_or_path: {model}
        dtype: float32
        task: countdown
        dataset_generate: 24
        dataset_seed: 1
        system_prompt: "Answer with <think> and <answer> tags."
        max_steps: {max_steps}
        save_steps: {save_steps}
        learning_rate: 1.0e-3
        per_device_train_batch_size: {batch}
        seed: 7
        output_dir: {output_dir}
    """)


def recipe_file(tmp_path: Path, model: Path, command: str, extra: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "my_rewards.py").write_text(USER_REWARD)
    common = tiny_run_keys(model, tmp_path / command)
    specific = {
        "rl": f"""
        reward_funcs: [countdown_format, countdown_equation, "{tmp_path / 'my_rewards.py'}:vowel_share"]
        num_generations: 4
        max_completion_length: 12
        temperature: 1.0
        """,
        "sft": """
        max_length: 256
        """,
    }[command]
    path = tmp_path / f"{command}.yaml"
    path.write_text(common + textwrap.dedent(specific) + textwrap.dedent(extra))
    return path


def train(path: Path, command: str, overrides: list[str] | None = None, **kwargs) -> Path:
    from grpo_cli.train.rl import run_rl
    from grpo_cli.train.sft import run_sft

    recipe = load_recipe(str(path), overrides or [], command)
    return (run_rl if command == "rl" else run_sft)(recipe, **kwargs)


def state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def test_grpo_lora_trains_logs_rewards_and_saves_adapter(tmp_path, tiny_model_dir):
    out = train(recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\nlora_alpha: 8\n"), "rl")
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert (out / "tokenizer_config.json").is_file()
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()  # the template the run used
    mask = os.umask(0)
    os.umask(mask)
    for name in ("adapter_model.safetensors", "recipe.yaml", "train_summary.json"):  # not left private (0600)
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 4  # 2 steps x (4 completions per generation batch)
    assert set(rollouts[0]["rewards"]) >= {"countdown_format", "countdown_equation"}
    assert len(rollouts[0]["rewards"]) == 3
    assert {"step", "prompt", "completion", "advantage"} <= set(rollouts[0])
    assert rollouts[0]["prompt"].endswith("<|im_start|>assistant\n<think>") or "<|im_start|>assistant" in rollouts[0]["prompt"]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_step"] == 2
    logged = [entry for entry in summary["log_history"] if "reward" in entry]
    assert logged and "rewards/countdown_format/mean" in logged[0]
    # the share of groups with every completion right (countdown_equation at its top), as the report reads it
    # from rollouts.jsonl
    solved = read_run(out).solved
    assert [entry["frac_groups_solved"] for entry in logged] == [solved[entry["step"]] for entry in logged]
    recipe = (out / "recipe.yaml").read_text()
    assert "countdown_equation" in recipe and "max_steps: 2" in recipe


def test_a_group_is_solved_when_every_completion_reaches_the_top():
    import torch

    from grpo_cli.train.batch_hooks import solved_groups

    nan = float("nan")  # a reward that did not apply to a completion
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, nan, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    assert solved_groups(scores, 1.0, 4) == [True, False, False, False]
    assert solved_groups(scores, 0.5, 4) == [True, False, False, True]


def test_grpo_full_finetuning_changes_weights(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    out = train(recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.0\n"), "rl")
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    changed = [k for k in before if k in after and not (before[k] == after[k]).all()]
    assert changed, "two GRPO steps changed no weight"
    assert not (out / "adapter_config.json").exists()


def test_sft_lora_and_full(tmp_path, tiny_model_dir):
    lora = train(recipe_file(tmp_path, tiny_model_dir, "sft", "use_peft: true\nlora_r: 4\n"), "sft")
    assert (lora / "adapter_model.safetensors").is_file()
    losses = [e["loss"] for e in json.loads((lora / "train_summary.json").read_text())["log_history"] if "loss" in e]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    full = train(recipe_file(tmp_path / "full", tiny_model_dir, "sft"), "sft")
    assert (full / "model.safetensors").is_file()


def test_resume_continues_the_step_count(tmp_path, tiny_model_dir, capsys):
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    out = train(path, "rl")
    assert state(out / "checkpoint-2")["global_step"] == 2
    mask = os.umask(0)
    os.umask(mask)  # a checkpoint is as readable as the umask says (safetensors alone leaves its weights 0600)
    assert {p.stat().st_mode & 0o777 for p in (out / "checkpoint-2").iterdir() if p.is_file()} == {0o666 & ~mask}
    (out / "checkpoint-2" / "optimizer.pt").unlink()  # said aloud: the optimizer starts afresh
    train(path, "rl", ["--max_steps", "3"])
    err = capsys.readouterr().err.replace("\n", " ")
    assert "resuming" in err and "checkpoint-2 holds no optimizer.pt: the run resumes its weights with a fresh" in err
    assert state(out / "checkpoint-3")["global_step"] == 3
    assert json.loads((out / "train_summary.json").read_text())["global_step"] == 3
    with pytest.raises(UserError, match="already holds"):
        train(path, "rl", resume=False)


def test_a_run_resumed_with_more_steps_trains_its_first_new_step_at_the_schedules_rate(tmp_path, tiny_model_dir):
    """`--max_steps 2`, then `--max_steps 4`: the linear schedule's step 3 trains at half the learning rate (it
    trained at 0, the rate the optimizer saved at the end of the first schedule), and a new `learning_rate` holds."""
    import torch
    from safetensors.torch import load_file

    path = recipe_file(tmp_path, tiny_model_dir, "sft", "lr_scheduler_type: linear\nwarmup_steps: 0\nlogging_steps: 1\n")
    out = train(path, "sft")
    train(path, "sft", ["--max_steps", "4"])
    before = load_file(out / "checkpoint-2" / "model.safetensors")
    after = load_file(out / "checkpoint-3" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)

    def rates(checkpoint: str) -> dict:  # the learning rate each step trained at
        return {e["step"]: e["learning_rate"] for e in state(out / checkpoint)["log_history"] if "learning_rate" in e}

    assert rates("checkpoint-4")[3] == pytest.approx(1e-3 * 2 / 4)
    train(path, "sft", ["--max_steps", "6", "--learning_rate", "1e-2"])
    assert rates("checkpoint-6")[5] == pytest.approx(1e-2 * 2 / 6)  # the new learning rate, not the checkpoint's


def test_one_run_per_output_folder_and_rl_never_resumes_an_sft_run(tmp_path, tiny_model_dir):
    sft_out = train(recipe_file(tmp_path, tiny_model_dir, "sft"), "sft")
    rl = recipe_file(tmp_path, tiny_model_dir, "rl")
    with pytest.raises(UserError, match=r"holds a `grpo sft` run: `grpo rl` would resume its checkpoint-2"):
        train(rl, "rl", ["--output_dir", str(sft_out), "--max_steps", "3"])
    hold = (
        f"from grpo_cli.run_folder import RunLock; RunLock({str(tmp_path / 'rl')!r}); "
        "print('held', flush=True); import time; time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"is in use by another grpo run \(pid {holder.pid} on .*, started "):
            train(rl, "rl")
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "rl" / "checkpoint-1").exists()
    out = train(rl, "rl")  # free once the other run ended; its lock file goes with this run's end
    assert (out / "checkpoint-2").is_dir() and not (out / ".grpo-run.lock").exists()
    sft = recipe_file(tmp_path, tiny_model_dir, "sft")
    unsaved = ["--save_strategy", "no", "--output_dir", str(tmp_path / "unsaved")]
    model = (train(sft, "sft", unsaved) / "model.safetensors").read_bytes()
    with pytest.raises(UserError, match="is a finished run with no checkpoint to resume"):
        train(sft, "sft", unsaved)
    assert (tmp_path / "unsaved" / "model.safetensors").read_bytes() == model


def test_checkpoint_cut_short_is_never_resumed(tmp_path, tiny_model_dir):
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    out = train(path, "rl")
    # A process killed while saving checkpoint-3 leaves a folder without trainer_state.json.
    partial = out / "checkpoint-3"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    train(path, "rl", ["--max_steps", "3"])
    assert state(out / "checkpoint-3")["global_step"] == 3  # resumed from 2, saved a good 3


def signal_a_run(
    path: Path, signum: int, as_timeout_does: bool = False, processes: int = 1, relaunch: bool = False
) -> tuple[int, str]:
    """Start `grpo rl` on the recipe, send `signum` once it logged step 1, return its exit code and stderr.
    `as_timeout_does`: to the process and then to its process group, which `timeout` does within a moment (a tenth
    of a second apart here, so that the kernel cannot merge the two into one). With several `processes`: to the
    process group alone, as a terminal's Ctrl-C reaches every process of the run. `relaunch`: one process, started
    through `accelerate launch` as `--num-processes 1` does."""
    launch = ["--num-processes", str(processes)] if processes > 1 or relaunch else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli", "rl", "-c", str(path), "--max_steps", "50", "--save_steps", "100", *launch],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "step 1/50" in line or "step  1/50" in line:
            if processes > 1:
                os.killpg(proc.pid, signum)
                break
            proc.send_signal(signum)
            if as_timeout_does:
                time.sleep(0.1)
                os.killpg(proc.pid, signum)
            break
    _, rest = proc.communicate(timeout=300)
    return proc.returncode, "".join(lines) + rest


def test_ctrl_c_saves_a_usable_checkpoint(tmp_path, tiny_model_dir):
    """SIGINT during a run: the step finishes, a checkpoint is saved, the process exits 130; a rerun resumes."""
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    code, text = signal_a_run(path, signal.SIGINT)
    assert code == 130, text
    assert "Traceback" not in text
    saved = sorted((tmp_path / "rl").glob("checkpoint-*"))
    assert saved and state(saved[-1])["global_step"] >= 1
    out = train(path, "rl", ["--max_steps", str(state(saved[-1])["global_step"] + 1)])
    assert json.loads((out / "train_summary.json").read_text())["global_step"] == state(saved[-1])["global_step"] + 1


def test_sigterm_to_grpo_alone_stops_a_relaunched_one_process_run(tmp_path, tiny_model_dir):
    """`--num-processes 1` runs through accelerate's one-process launcher: a SIGTERM sent to `grpo` alone (kill, a
    container runtime) reaches the run, which saves and stops; `grpo` exits 143 once it has."""
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    code, text = signal_a_run(path, signal.SIGTERM, relaunch=True)
    assert "SIGTERM: saving a checkpoint" in text and "Traceback" not in text, text
    assert code == 143, text
    saved = sorted((tmp_path / "rl").glob("checkpoint-*"))
    assert saved and 1 <= state(saved[-1])["global_step"] < 50


def test_ctrl_c_saves_every_rank_of_a_two_process_run(tmp_path, tiny_model_dir):
    """A terminal's Ctrl-C reaches every process of the run, and torchrun passes a stop on to the ranks again (SIGINT,
    then SIGTERM): each rank takes the copies for one request, finishes the step and saves."""
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    code, text = signal_a_run(path, signal.SIGINT, processes=2)
    assert text.count("Ctrl-C: saving a checkpoint") == 2 and "quitting now" not in text, text
    assert code == 130 and "Traceback" not in text, text  # the launch ends as the signal, not as torchrun's crash
    saved = sorted((tmp_path / "rl").glob("checkpoint-*"))
    assert saved and state(saved[-1])["global_step"] >= 1


def test_gpu_options_on_cpu_get_a_clear_error(tmp_path, tiny_model_dir):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    extra = "use_peft: true\nload_in_4bit: true\nbf16: true\nactivation_offloading: true\n"
    path = recipe_file(tmp_path, tiny_model_dir, "rl", extra)
    run = subprocess.run([sys.executable, "-m", "grpo_cli", "rl", "-c", str(path)], capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert "load_in_4bit" in run.stderr and "bf16" in run.stderr and "Traceback" not in run.stderr
    assert "activation_offloading: true moves activations from a CUDA GPU" in run.stderr
    assert not (tmp_path / "rl" / "rollouts.jsonl").exists()


def test_activation_offloading_is_one_key_for_both_commands():
    cpu = ["--bf16", "false", "--use_cpu", "true"]  # what grpo sets on a CPU; GRPOConfig checks it
    rl = load_recipe(None, ["--activation_offloading", "true", *cpu], "rl")
    assert rl.memory.activation_offloading is True
    assert not hasattr(rl.training_config(), "activation_offloading")  # grpo's own key for rl, not GRPOConfig's
    assert load_recipe(None, [], "rl").memory.activation_offloading is False
    sft = load_recipe(None, ["--activation_offloading", "true", *cpu], "sft")
    assert sft.training_config().activation_offloading is True  # SFTConfig's own


def test_cpu_defaults_fill_only_unset_keys(tmp_path):
    cpu = Hardware(gpu=False, processes=2)
    recipe = load_recipe(None, ["--output_dir", str(tmp_path)], "rl", cpu)
    assert recipe.values["bf16"] is False and recipe.values["use_cpu"] is True
    assert recipe.values["dataloader_pin_memory"] is False
    assert recipe.values["rollout_engine"] == "trl"  # TRL's generate: on the CPU it is faster
    assert recipe.where("bf16") == recipe.where("rollout_engine") == "hardware default (no GPU)"
    chosen = load_recipe(None, ["--bf16", "true", "--use_cpu", "false", "--rollout_engine", "grpo"], "rl", cpu)
    assert chosen.values["bf16"] is True and chosen.values["use_cpu"] is False
    assert chosen.values["rollout_engine"] == "grpo" and chosen.where("bf16") == "command line"
    assert "use_cpu" not in load_recipe(None, [], "rl", Hardware(gpu=False)).values  # one process trains alone


def test_gpu_defaults_turn_liger_on_for_grpo_only_where_it_is_installed_and_unset(tmp_path, tiny_model_dir):
    gpu = Hardware(gpu=True, liger=True)
    model = ["--model_name_or_path", str(tiny_model_dir)]  # a local config: no Hub lookup
    rl = load_recipe(None, ["--output_dir", str(tmp_path), *model], "rl", gpu)
    assert rl.values["use_liger_kernel"] is True
    assert rl.where("use_liger_kernel") == "hardware default (GPU, liger-kernel installed)"
    assert rl.values["rollout_engine"] == "grpo" and rl.where("rollout_engine") == "hardware default (GPU)"
    # TRL's own key for its generate, set in a recipe: TRL's generate, as before `rollout_engine` existed
    dynamic = load_recipe(None, ["--cache_implementation", "dynamic", *model], "rl", gpu)
    assert dynamic.values["rollout_engine"] == "trl"
    assert dynamic.where("rollout_engine") == "hardware default (cache_implementation: dynamic)"

    chosen = load_recipe(None, ["--use_liger_kernel", "false", *model], "rl", gpu)
    sft = load_recipe(None, [], "sft", gpu)
    zero3 = load_recipe(None, ["--deepspeed", "zero3.json"], "rl", gpu)
    assert chosen.values["use_liger_kernel"] is False
    assert "use_liger_kernel" not in sft.values and "use_liger_kernel" not in zero3.values

    missing = load_recipe(None, model, "rl", Hardware(gpu=True, liger=False))
    assert "use_liger_kernel" not in missing.values
    assert any("liger-kernel is not installed" in note for note in missing.warnings)  # shown with the plan


def test_gpu_defaults_compute_lora_layers_through_fused_lora_where_their_weights_are_whole(tmp_path, tiny_model_dir):
    gpu = Hardware(gpu=True)

    def recipe(*overrides, hardware=gpu):
        model = ["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(tmp_path)]
        return load_recipe(None, [*model, *overrides], "rl", hardware)

    lora = recipe("--use_peft", "true")
    assert lora.kernels.fused_lora and lora.where("fused_lora") == "hardware default (GPU, LoRA)"
    assert not recipe().kernels.fused_lora  # full fine-tuning: no LoRA layers (and no refusal of the default)
    assert not recipe("--use_peft", "true", "--fused_lora", "false").kernels.fused_lora
    assert not recipe("--use_peft", "true", hardware=Hardware(gpu=False)).kernels.fused_lora
    assert not recipe("--use_peft", "true", hardware=Hardware(gpu=True, sharded=True)).kernels.fused_lora
    assert not recipe("--use_peft", "true", "--deepspeed", "zero3.json").kernels.fused_lora


def test_gpu_defaults_offload_layer_inputs_where_the_forward_backward_sets_the_peak(tmp_path, tiny_model_dir):
    """The tiny model: hidden 64, 2 key/value heads of 16. Micro-batches of 8 out of a generation batch of 8 move
    layer inputs as large as the rollout's KV cache (share 1.0); of 2 out of 16, an eighth of it."""
    gpu = Hardware(gpu=True)

    def recipe(*overrides, hardware=gpu):
        return load_recipe(
            None, ["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(tmp_path), *overrides], "rl",
            hardware,
        )

    large = recipe()
    assert large.memory.activation_offloading and large.memory.lean_lm_head
    assert large.where("activation_offloading") == (
        "hardware default (GPU: a micro-batch's layer inputs are 1.00x the rollout's KV cache)"
    )
    lora = recipe("--use_peft", "true")
    assert lora.memory.activation_offloading and "lean_lm_head" not in lora.values  # LoRA trains no LM head

    small = recipe("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8")
    lora_half = recipe("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--use_peft", "true")
    no_checkpointing = recipe("--gradient_checkpointing", "false")
    chosen = recipe("--activation_offloading", "false", "--lean_lm_head", "false")
    zero3 = recipe("--deepspeed", "zero3.json")
    fsdp = recipe("--fsdp", "full_shard")
    unknown_model = load_recipe(None, ["--model_name_or_path", str(tmp_path / "none")], "rl", gpu)
    sft = load_recipe(None, ["--model_name_or_path", str(tiny_model_dir)], "sft", gpu)
    for each in (small, lora_half, no_checkpointing, chosen, zero3, fsdp, unknown_model, sft):
        assert not each.memory.activation_offloading and not each.memory.lean_lm_head

    half = recipe("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2")
    assert half.memory.activation_offloading  # share 0.5: enough with full fine-tuning

    # `accelerate launch` with a DeepSpeed config: the launcher shards the weights
    launched = recipe(hardware=Hardware(gpu=True, processes=2, sharded=True))
    assert "activation_offloading" not in launched.values and "lean_lm_head" not in launched.values


def test_detect_hardware_reads_the_launcher(monkeypatch):
    for variable in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", *LAUNCHER_VARIABLES):
        monkeypatch.delenv(variable, raising=False)
    assert detect_hardware().processes == 1 and not detect_hardware().sharded
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    launched = detect_hardware()
    assert launched.processes == 2 and launched.sharded
    assert detect_hardware(accelerate_config={"distributed_type": "FSDP"}).sharded


def test_a_resolved_recipe_is_read_only(tmp_path):
    import dataclasses

    recipe = load_recipe(None, ["--output_dir", str(tmp_path)], "rl", Hardware(gpu=False))
    with pytest.raises(TypeError):
        recipe.values["bf16"] = True
    with pytest.raises(TypeError):
        recipe.locations["bf16"] = "command line"
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.values = {}
    config = recipe.training_config()
    config.output_dir = "elsewhere"  # a config built from the recipe is its own
    assert recipe.values["output_dir"] == str(tmp_path)


def test_the_run_writes_the_recipe_the_check_resolved(tmp_path, tiny_model_dir):
    from grpo_cli.recipe.show import check_and_show
    from grpo_cli.train.sft import run_sft

    path = recipe_file(tmp_path, tiny_model_dir, "sft")
    recipe, plan = check_and_show(str(path), ["--max_steps", "1"], "sft", show=False)
    assert dict(plan.rows)["bf16"] == "false" and plan.sources["bf16"] == "hardware default (no GPU)"
    out = run_sft(recipe)
    written = yaml.safe_load((out / "recipe.yaml").read_text())
    assert written == dict(recipe.values)
    assert written["bf16"] is False and written["dataloader_pin_memory"] is False


def test_a_finished_run_is_not_trained_again(tmp_path, tiny_model_dir):
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    out = train(path, "rl")
    before = (out / "adapter_model.safetensors").read_bytes()
    with pytest.raises(UserError, match=r"is a finished run: it trained 2 steps \(`max_steps` 2\).*--max_steps 3"):
        train(path, "rl")
    assert (out / "adapter_model.safetensors").read_bytes() == before
    assert not (out / "checkpoint-3").exists()


def test_a_folder_holding_a_model_or_other_files_is_not_written_into(tmp_path, tiny_model_dir):
    import shutil

    model_copy = tmp_path / "a-model"
    shutil.copytree(tiny_model_dir, model_copy)
    path = recipe_file(tmp_path, tiny_model_dir, "sft")
    with pytest.raises(UserError, match=r"already holds a model, not a grpo run.*--overwrite"):
        train(path, "sft", ["--output_dir", str(model_copy)])
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("keep me")
    with pytest.raises(UserError, match=r"holds 1 file\(s\) of something else \(ideas.txt\)"):
        train(path, "sft", ["--output_dir", str(notes)])
    assert sorted(p.name for p in model_copy.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    out = train(path, "sft", ["--output_dir", str(notes)], overwrite=True)  # asked for: written into
    assert (out / "ideas.txt").read_text() == "keep me" and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("as_timeout_does", [False, True])
def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path, tiny_model_dir, as_timeout_does):
    """Also when the signal comes twice within a moment, as `timeout` sends it (to the run, then to its group)."""
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    code, text = signal_a_run(path, signal.SIGTERM, as_timeout_does)
    assert code == 143, text
    assert "SIGTERM: saving a checkpoint" in text and "Traceback" not in text and "quitting now" not in text
    saved = sorted((tmp_path / "rl").glob("checkpoint-*"))
    assert saved and state(saved[-1])["global_step"] >= 1


STUCK_MAIN_THREAD = """
import ctypes, signal, sys, types
from grpo_cli.train.checkpoints import GracefulStop
from grpo_cli.train.stall import StallWatch
stall = StallWatch(sys.argv[1], 600)
stall.on_train_begin(None, types.SimpleNamespace(global_step=0), None)
stop = GracefulStop()
stop.before_quit.append(stall.remove_if_empty)  # as a run sets it
stop.install()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the main thread never runs a Python handler now
print("stuck", flush=True)
ctypes.CDLL(None).sleep(60)  # one long C call, like a step that never ends
print("woke up", flush=True)
"""


def test_a_second_ctrl_c_quits_even_when_the_main_thread_is_stuck(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", STUCK_MAIN_THREAD, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "stuck"
    assert (tmp_path / "stall-stacks.txt").is_file()  # the stall watch's file, empty while nothing stalled
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    time.sleep(0.1)
    child.send_signal(signal.SIGINT)  # the same request again within a moment, as `timeout` sends it
    time.sleep(SECOND_SIGNAL_AFTER_S + 0.5)
    assert child.poll() is None  # the first one waits for the step to end
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 130 and time.monotonic() - started < 20, (out, err)
    assert "second signal: quitting now without saving" in err and "woke up" not in out
    assert not (tmp_path / "stall-stacks.txt").exists()  # quitting left no empty file behind


def test_resuming_keeps_one_rollout_row_per_completion_of_each_step(tmp_path, tiny_model_dir):
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    out = train(path, "rl")
    rollouts = out / "rollouts.jsonl"
    # A run killed during step 3 leaves that step's rows (and maybe half a line) behind checkpoint-2.
    with open(rollouts, "a") as extra:
        extra.write(json.dumps({"step": 2, "completion": "from the killed run"}) + "\n" + '{"step": 2, "compl')
    train(path, "rl", ["--max_steps", "3"])
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert [row["step"] for row in rows] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(row["completion"] != "from the killed run" for row in rows)
    train(path, "rl", ["--max_steps", "1"], resume=False, overwrite=True)  # a fresh run starts the file anew
    assert len(rollouts.read_text().splitlines()) == 4


def test_a_full_disk_is_one_message_naming_the_last_complete_checkpoint(tmp_path, tiny_model_dir):
    with mounted_tmpfs(tmp_path / "small", "size=3m") as disk:
        path = recipe_file(tmp_path, tiny_model_dir, "rl", f"use_peft: true\nlora_r: 4\noutput_dir: {disk / 'run'}\n")
        path.write_text(path.read_text().replace(f"output_dir: {tmp_path / 'rl'}\n", ""))
        with pytest.raises(UserError, match=r"out of disk space writing into .*small/run"):
            train(path, "rl", ["--max_steps", "40"])


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_damaged_weights_and_another_model_are_one_message_each(tmp_path, tiny_model_dir, tiny_adapter_dir):
    import shutil

    # eval of a model whose weights were cut short, and of one whose config is empty
    cut = tmp_path / "cut-model"
    shutil.copytree(tiny_model_dir, cut)
    _truncate(cut / "model.safetensors", 5000)
    empty = tmp_path / "empty-config"
    shutil.copytree(tiny_model_dir, empty)
    (empty / "config.json").write_text("{}")
    recipe = recipe_file(tmp_path / "eval", tiny_model_dir, "rl", "dataset_test_size: 4\n")
    for model, says in ((cut, "model.safetensors cannot be read"), (empty, "cannot load model")):
        proc = subprocess.run(
            [sys.executable, "-m", "grpo_cli", "eval", "-c", str(recipe), "--model", str(model), "--limit", "2",
             "-o", str(tmp_path / "e")],
            capture_output=True, text=True, timeout=600, check=False,
        )
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    # merge of an adapter whose weights were cut short
    adapter = tmp_path / "cut-adapter"
    shutil.copytree(tiny_adapter_dir, adapter)
    _truncate(adapter / "adapter_model.safetensors", 1000)
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "merge", "--adapter", str(adapter), "--base", str(tiny_model_dir),
         "--output", str(tmp_path / "merged")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 2 and "adapter_model.safetensors cannot be read" in proc.stderr, proc.stderr
    assert not (tmp_path / "merged").exists()
    # resuming from a checkpoint whose weights were cut short, and with another model
    path = recipe_file(tmp_path / "run", tiny_model_dir, "rl", "beta: 0.0\n")
    out = train(path, "rl")
    other = save_model_of_another_shape(tiny_model_dir, tmp_path / "other-model")
    with pytest.raises(UserError, match=r"does not fit .*other-model: its weights have other shapes"):
        train(path, "rl", ["--max_steps", "3", "--model_name_or_path", str(other)])
    _truncate(out / "checkpoint-2" / "model.safetensors", 5000)
    with pytest.raises(UserError, match=r"the latest checkpoint cannot be resumed: .*checkpoint-2/model.safetensors"):
        train(path, "rl", ["--max_steps", "3"])


def test_rewards_score_of_a_binary_file_is_one_message(tmp_path):
    binary = tmp_path / "completions.jsonl"
    binary.write_bytes(b'{"completion": "a"}\n\xff\xfe\x00\x01')
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "rewards", "score", "-c", "countdown", "-i", str(binary)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 2 and "line 2: not UTF-8 text" in proc.stderr and "Traceback" not in proc.stderr
