"""rollpacker's components inside training loops it did not write (each an extra: `trl`)."""
