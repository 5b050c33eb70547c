"""The embedded demo: a tiny RL trainer that runs any objective on a CPU in minutes, and the token audit.

Nothing here is imported by ``import rlstab``; ``rlstab demo`` and ``rlstab audit`` load it.
"""
