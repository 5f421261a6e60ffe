"""A small corpus of distinct topics and queries about them, shared by the service and client tests."""

PASSAGES = [
    ("Mercury (planet)", "Mercury is the smallest planet of the Solar System and the closest to the Sun."),
    ("Mercury (element)", "Mercury is a chemical element with symbol Hg, a heavy silvery metal liquid at room temperature."),
    ("Venus", "Venus is the second planet from the Sun, with a thick carbon dioxide atmosphere."),
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600, set in Denmark."),
    ("William Shakespeare", "William Shakespeare was an English playwright and poet born in Stratford-upon-Avon."),
    ("Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("Berlin", "Berlin is the capital of Germany and its most populous city."),
    ("Python (programming language)", "Python is a high-level programming language created by Guido van Rossum."),
    ("Python (snake)", "Pythons are large nonvenomous snakes found in Africa, Asia and Australia."),
    ("Amazon River", "The Amazon is the largest river in South America by discharge of water."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Photosynthesis", "Photosynthesis is the process plants use to turn light, water and carbon dioxide into sugar."),
    ("Jazz", "Jazz is a music genre that originated in New Orleans in the late 19th century."),
    ("Marie Curie", "Marie Curie was a physicist and chemist who won two Nobel Prizes for research on radioactivity."),
    ("Great Wall of China", "The Great Wall of China is a series of fortifications built across northern China."),
    ("Chess", "Chess is a board game for two players played on a checkered board with 64 squares."),
]
CONTENTS = {str(i): f'"{title}"\n{text}' for i, (title, text) in enumerate(PASSAGES)}
QUERIES = ["mercury", "who wrote hamlet", "capital of france", "python", "highest mountain", "radioactivity research",
           "music from new orleans", "largest river", "board game", "plants and light", "german capital", "venus"]
