from waypost.runner.main import main

main()
