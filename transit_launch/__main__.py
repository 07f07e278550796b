from transit_launch.cli import main

raise SystemExit(main())
