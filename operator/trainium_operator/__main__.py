"""`python -m trainium_operator` is the console script."""

from trainium_operator.cli import main

main()
