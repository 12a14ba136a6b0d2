"""Instruments: what runs on the training thread (DataLoader wrapper, optimizer hook, timers)."""
