from gpubook_cli.main import cli

cli(prog_name="gpubook")
