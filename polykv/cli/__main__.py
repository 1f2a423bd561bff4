"""`python -m polykv.cli`: the same as the `polykv` console script."""

from polykv.cli import main

if __name__ == "__main__":
    main()
