from pp_launch.cli.entry import main

main()
