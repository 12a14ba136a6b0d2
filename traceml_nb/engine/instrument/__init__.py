"""Instruments: what runs on the training thread (DataLoader wrapper, optimizer step counting, timers)."""
