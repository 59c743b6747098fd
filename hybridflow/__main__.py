import sys

from hybridflow.cli import main

sys.exit(main())
