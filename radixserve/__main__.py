"""`python -m radixserve ...`: the same as the `radixserve` console script."""

import sys

from radixserve.cli import main

if __name__ == "__main__":
    sys.exit(main())
