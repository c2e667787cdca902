"""The conformance corpus and the script that regenerates its expected outputs."""
