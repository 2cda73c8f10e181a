"""The shipped accelerate configs load with accelerate's own classes and launch what their names promise."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_cli.launch import shipped_accelerate_configs

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "accelerate"

# name: (distributed_type, zero_stage, offload_optimizer_device, offload_param_device,
#        zero3_save_16bit_model, num_machines)
EXPECTED = {
    "single_gpu": ("NO", None, None, None, None, 1),
    "ddp": ("MULTI_GPU", None, None, None, None, 1),
    "zero2": ("DEEPSPEED", 2, "none", "none", None, 1),
    "zero3": ("DEEPSPEED", 3, "none", "none", True, 1),
    "zero3_offload": ("DEEPSPEED", 3, "cpu", "cpu", True, 1),
    "zero3_multinode": ("DEEPSPEED", 3, "none", "none", True, 2),
}
DEEPSPEED = [name for name, spec in EXPECTED.items() if spec[0] == "DEEPSPEED"]


def test_the_shipped_configs_are_the_documented_ones():
    assert sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) == sorted(EXPECTED)
    assert {name: path.resolve() for name, path in shipped_accelerate_configs().items()} == {
        name: (CONFIG_DIR / f"{name}.yaml").resolve() for name in EXPECTED
    }


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerates_config_classes(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    kind, stage, offload_optimizer, offload_param, save_16bit, machines = EXPECTED[name]
    config = load_config_from_file(str(CONFIG_DIR / f"{name}.yaml"))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type == DistributedType(kind)
    assert config.mixed_precision == "bf16"
    assert config.num_machines == machines
    assert config.num_processes >= machines
    assert config.use_cpu is False
    deepspeed = config.deepspeed_config
    assert deepspeed.get("zero_stage") == stage
    assert deepspeed.get("offload_optimizer_device") == offload_optimizer
    assert deepspeed.get("offload_param_device") == offload_param
    assert deepspeed.get("zero3_save_16bit_model") == save_16bit
    if stage == 3:
        assert deepspeed["zero3_init_flag"] is True
    # DeepSpeed stops when these differ from the recipe; left out, the recipe's values fill its "auto".
    assert "gradient_accumulation_steps" not in deepspeed
    assert "gradient_clipping" not in deepspeed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_says_when_to_use_it(name):
    text = (CONFIG_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    header = text.split("compute_environment:")[0]
    assert header.startswith("# ")
    assert "Use it" in header
    assert isinstance(yaml.safe_load(text)["distributed_type"], str)  # an unquoted NO would read as false


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_launch_accepts_config(name):
    """accelerate's own launch validation turns each file into the launcher it promises."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(CONFIG_DIR / f"{name}.yaml"), "-m", "grpo_cli", "rl"])
    args, _, _ = _validate_launch_command(args)
    kind = EXPECTED[name][0]
    assert args.use_deepspeed == (kind == "DEEPSPEED")
    assert args.multi_gpu == (kind == "MULTI_GPU")
    assert args.mixed_precision == "bf16"
    assert args.module and args.training_script == "grpo_cli" and args.training_script_args == ["rl"]
    if kind == "DEEPSPEED":
        assert args.zero_stage == EXPECTED[name][1]
        assert args.deepspeed_multinode_launcher == "standard"


@pytest.mark.parametrize("name", DEEPSPEED)
def test_deepspeed_plugin_built_from_config(name, monkeypatch):
    """The DeepSpeed config accelerate builds in each process: stage, offload, 16-bit weights on save."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    _, stage, offload_optimizer, offload_param, save_16bit, _ = EXPECTED[name]
    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIG_DIR / f"{name}.yaml"), "-m", "grpo_cli"]
    )
    args, defaults, _ = _validate_launch_command(args)
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    if args.num_machines > 1:
        args.machine_rank = 1  # rank 0 would check that the main port is free here
    _, env = prepare_deepspeed_cmd_env(args)
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["stage"] == stage
    assert zero["offload_optimizer"]["device"] == offload_optimizer
    assert zero["offload_param"]["device"] == offload_param
    assert zero["stage3_gather_16bit_weights_on_model_save"] is bool(save_16bit)
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == "auto"
    assert plugin.deepspeed_config["gradient_clipping"] == "auto"


def test_multinode_template_takes_machine_values_from_the_command_line():
    """As the template documents: rank, address and port passed to `accelerate launch` override the file."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    argv = [
        "--config_file", str(CONFIG_DIR / "zero3_multinode.yaml"),
        "--num_machines", "3", "--num_processes", "24",
        "--machine_rank", "2", "--main_process_ip", "10.1.2.3", "--main_process_port", "29555",
        "-m", "grpo_cli", "rl", "--config", "countdown",
    ]  # fmt: skip
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    prepare_deepspeed_cmd_env(args)
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("3", 2, "8")
    # accelerate's --same_network flag ignores the file's value: the address goes as torchrun's rdzv endpoint
    endpoint = getattr(args, "rdzv_endpoint", None) or f"{args.master_addr}:{args.master_port}"
    assert endpoint == "10.1.2.3:29555"
