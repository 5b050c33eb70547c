from quick_regimes import cache  # noqa: F401  (the shared warm-start cache fixture)
