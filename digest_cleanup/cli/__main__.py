from digest_cleanup.cli import main

raise SystemExit(main())
