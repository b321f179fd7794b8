"""What every layer shares, at the bottom of the stack: the one-line user errors
(`errors`), crash-safe file writes (`files`), paths on local disks and object stores
(`storage`), and the entry points' flags and exit codes (`cli`, used by entry points only)."""
