"""`python -m newtc`: the newtc command."""
import sys

from .cli import main

sys.exit(main())
