"""The kernel map: which verify widths compute what single-token passes compute, as evidence, causes and text."""
