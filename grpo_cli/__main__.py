from grpo_cli.cli import main

main()
