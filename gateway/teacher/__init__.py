"""The teacher: a frozen model behind the engine client that labels turns and force-decodes kept
trajectories. It knows nothing about sessions, HTTP or training."""
