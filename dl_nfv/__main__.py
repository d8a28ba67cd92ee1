"""``python -m dl_nfv`` behaves exactly like the ``dl-nfv`` command."""

from dl_nfv.cli.main import main

if __name__ == "__main__":
    main()
