from waypost.cli.main import main

main()
