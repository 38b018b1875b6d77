"""`python -m workers.warm --job-id ID --attempt N` (the client), `... --serve SOCKET` (a node's server)."""

import sys

if sys.argv[1:2] == ["--serve"]:
    from workers.warm.server import serve_main

    sys.exit(serve_main(sys.argv[2]))

from workers.warm.client import main

sys.exit(main())
