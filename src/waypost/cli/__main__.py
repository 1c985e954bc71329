from waypost.cli.main import main

raise SystemExit(main())
