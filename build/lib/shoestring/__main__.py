from shoestring.cli import main

main()
