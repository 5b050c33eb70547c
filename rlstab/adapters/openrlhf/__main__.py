"""``python -m rlstab.adapters.openrlhf``: see [`launcher`][rlstab.adapters.openrlhf.launcher]."""

from rlstab.adapters.openrlhf.launcher import main

if __name__ == "__main__":
    main()
