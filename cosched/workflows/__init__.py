"""The real workflows in cosched: what co-location costs their stages (the replay's model), its
calibration from real runs, and the commands that build their image, write and verify submissions."""
