"""`python -m deuteron`: the deuteron command."""
from .cli import main

raise SystemExit(main())
