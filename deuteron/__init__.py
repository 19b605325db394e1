"""deuteron: tile programs -> newt .nk text, with an eager oracle, an autotuner and a config cache."""
