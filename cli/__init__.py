"""The ``dl-nfv`` command line: click commands that parse, load, call one library function, write."""
