"""`python -m curb` runs the same command as the `curb` script.

Guarded, so that importing this module (pydoc, autodoc, pkgutil.walk_packages) starts nothing."""

from curb.cli import main

if __name__ == "__main__":
    main()
