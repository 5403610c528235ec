"""Plots shared by the reference trainer and the simulator (matplotlib, drawn off-screen)."""
