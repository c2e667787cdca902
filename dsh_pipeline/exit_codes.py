"""What ``dsh-pipeline`` exits with (documented in docs/howto/troubleshooting.md)."""

EXIT_OK = 0
EXIT_REFUSED = 1  # an input, a file, a setting or a state was refused (the message says which)
EXIT_USAGE = 2  # the command line (argparse)
EXIT_UNAVAILABLE = 69  # the cluster: no broker answered, or it refused this client (EX_UNAVAILABLE)
EXIT_INTERNAL = 70  # a bug: the traceback is printed for a report (EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # stopped by SIGINT or SIGTERM before the work was done
