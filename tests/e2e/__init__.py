"""End to end: whole training and evaluation runs, the command line, the README's commands."""
