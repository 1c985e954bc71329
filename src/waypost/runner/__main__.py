from waypost.runner.main import main

raise SystemExit(main())
