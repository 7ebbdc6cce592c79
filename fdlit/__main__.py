import sys

from fdlit.cli import main

sys.exit(main())
