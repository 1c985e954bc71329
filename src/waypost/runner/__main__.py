from waypost.runner.main import run_and_exit

run_and_exit()
