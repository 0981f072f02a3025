from detaudit.cli import main

raise SystemExit(main())
