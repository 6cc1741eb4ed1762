"""Timers, statistics, memory tracking and environment capture. No framework imports."""
