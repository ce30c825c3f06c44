"""`python -m curb` runs the same command as the `curb` script."""

from curb.cli import main

main()
