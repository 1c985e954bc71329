import sys

from waypost.cli.main import main

sys.exit(main())
