"""One module per ``specview`` subcommand, each with ``add_parser(subparsers)`` and ``main(args) -> int``.

The dispatcher in :mod:`specview.cli` imports only the chosen module, so
``specview --help`` never loads Qt, llama.cpp or MLX.
"""
