"""`python -m deuteron`: the deuteron command."""
import sys

from .cli import main

sys.exit(main())
